-- One row per candidate root-to-leaf path with its ranks, PathScore and Top-k rank (public, SPEC §3, §7).
-- grain: tree_id, leaf_id
-- sources: int_paths__measured, stg_root_added, run_config
--
-- avg_score_rank and max_score_rank are mid-rank pct among the ranked paths of the
-- same root. path_score = max*max_score_rank + avg*avg_score_rank +
-- clean*avg_cleanliness + know*avg_knowledge; rank orders the ranked paths of a
-- root by path_score (ties: smallest leaf id); selected = rank <= top_k. Weights and
-- top_k are the run config's unless the variables path_w_max, path_w_avg,
-- path_w_clean, path_w_know and path_top_k are set (reselection).
with measured as (
    select * from int_paths__measured
),

weights as (
    select
        coalesce(getvariable('path_w_max'), w_path_max) as w_max,
        coalesce(getvariable('path_w_avg'), w_path_avg) as w_avg,
        coalesce(getvariable('path_w_clean'), w_path_clean) as w_clean,
        coalesce(getvariable('path_w_know'), w_path_know) as w_know,
        coalesce(getvariable('path_top_k'), top_k) as top_k
    from run_config
),

counts as (
    select
        a.tree_id,
        a.leaf_id,
        count(*) filter (where b.avg_score_o < a.avg_score_o) as avg_less,
        count(*) filter (where b.avg_score_o = a.avg_score_o) as avg_equal,
        count(*) filter (where b.max_score_o < a.max_score_o) as max_less,
        count(*) filter (where b.max_score_o = a.max_score_o) as max_equal,
        count(*) as total
    from measured as a
    inner join measured as b on a.tree_id = b.tree_id and b.ranked
    where a.ranked
    group by all
),

scored as (
    select
        m.*,
        pct(c.avg_less, c.avg_equal, c.total) as avg_score_rank,
        pct(c.max_less, c.max_equal, c.total) as max_score_rank
    from measured as m
    left join counts as c using (tree_id, leaf_id)
),

weighted as (
    select
        s.*,
        w.w_max * s.max_score_rank + w.w_avg * s.avg_score_rank
        + w.w_clean * s.avg_cleanliness + w.w_know * s.avg_knowledge as path_score,
        w.top_k
    from scored as s
    cross join weights as w
),

ranked as (
    select
        *,
        case
            when ranked then row_number() over (
                partition by tree_id, ranked
                order by round(path_score, 12) desc, node_key(leaf_id)
            )
        end as rank
    from weighted
)

select
    r.tree_id,
    r.leaf_id,
    r.node_ids,
    r.ranked,
    r.avg_cleanliness,
    r.avg_knowledge,
    r.avg_score_o * r.sign as avg_score,
    r.avg_score_rank,
    r.max_score_o * r.sign as max_score,
    r.max_score_rank,
    r.path_score,
    r.rank,
    coalesce(r.rank <= r.top_k, false) as selected,
    root.task,
    root.stage,
    root.snapshot,
    r.depth,
    r.leaf_reason
from ranked as r
inner join stg_root_added as root using (tree_id)
