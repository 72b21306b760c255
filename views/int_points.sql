-- The points in time at which tree state is evaluated: now, plus every recorded decision in replay.
-- grain: run_id, tree_id, asof_seq
-- sources: stg_root_added, stg_log_tail, stg_node_selected, stg_tree_stopped, stg_paths_selected, stg_block_granted, stg_grants_closed
-- materialized: table
--
-- "now" is the last seq of the prefix. With `set variable asof_points = 'decisions'`
-- the watermark of every NodeSelected and TreeStopped decision is a point of its
-- tree, and the watermark of every PathsSelected decision a point of every tree,
-- so one query re-derives every recorded decision from the prefix it saw (replay).
-- for_paths marks the points where candidate paths are scored: now, and the
-- watermarks of the path selections.
-- A campaign's BlockGranted and GrantsClosed facts (int_trees__asof reads them) are
-- read here too, adding no tree: they make a tree's rows stale in every table that
-- joins its points, as its other facts do, so that the tables keep the same points.
with trees as (
    select run_id, tree_id from stg_root_added
    union
    select run_id, tree_id from stg_block_granted
    union
    select r.run_id, r.tree_id from stg_root_added as r
    where exists (select 1 from stg_grants_closed as g where g.run_id = r.run_id)
),

now_points as (
    select
        t.run_id,
        t.tree_id,
        tail.asof_seq,
        true as is_now,
        true as for_paths
    from trees as t
    inner join stg_log_tail as tail on t.run_id = tail.run_id
),

decision_points as (
    select run_id, tree_id, watermark as asof_seq, false as is_now, false as for_paths
    from stg_node_selected
    union all
    select run_id, tree_id, watermark as asof_seq, false as is_now, false as for_paths
    from stg_tree_stopped
    union all
    select t.run_id, t.tree_id, s.watermark as asof_seq, false as is_now, true as for_paths
    from stg_paths_selected as s
    inner join trees as t on s.run_id = t.run_id
),

final as (
    select
        run_id,
        tree_id,
        asof_seq,
        bool_or(is_now) as is_now,
        bool_or(for_paths) as for_paths
    from (
        select * from now_points
        union all
        select * from decision_points
        where coalesce(getvariable('asof_points'), 'now') = 'decisions'
    )
    group by all
)

select * from final
