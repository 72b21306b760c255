-- The points in time at which tree state is evaluated: now, plus every tree decision in replay.
-- grain: tree_id, asof_seq
-- sources: stg_root_added, stg_log_tail, stg_node_selected, stg_tree_stopped
--
-- "now" is the last seq of the prefix. With `set variable asof_points = 'decisions'`
-- the watermark of every NodeSelected and TreeStopped decision is a point too, so
-- one query re-derives every recorded decision from the prefix it saw (replay).
with trees as (
    select distinct tree_id from stg_root_added
),

now_points as (
    select
        t.tree_id,
        tail.asof_seq,
        true as is_now
    from trees as t
    cross join stg_log_tail as tail
),

decision_points as (
    select tree_id, watermark as asof_seq, false as is_now from stg_node_selected
    union all
    select tree_id, watermark as asof_seq, false as is_now from stg_tree_stopped
),

final as (
    select
        tree_id,
        asof_seq,
        bool_or(is_now) as is_now
    from (
        select * from now_points
        union all
        select * from decision_points
        where coalesce(getvariable('asof_points'), 'now') = 'decisions'
    )
    group by all
)

select * from final
