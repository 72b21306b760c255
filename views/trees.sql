-- One row per tree (root), as of now: stop reason, kept edges, leaves, best score, paths (public, ALGORITHM §7).
-- grain: run_id, tree_id
-- sources: int_trees__summarized, paths
--
-- The columns of int_trees__summarized (see there: kept_edges includes the
-- kept_exempt_edges; status is running, stopping or done), then the paths: paths
-- counts the candidate root-to-leaf paths, ranked those that can be ranked (every
-- node scored, every edge with a knowledge value), selected those in the Top-k;
-- top_path_score is the best PathScore.
with path_counts as (
    select
        run_id,
        tree_id,
        count(*) as paths,
        count(*) filter (where ranked) as ranked,
        count(*) filter (where selected) as selected,
        max(path_score) as top_path_score
    from paths
    group by all
)

select
    t.*,
    coalesce(p.paths, 0) as paths,
    coalesce(p.ranked, 0) as ranked,
    coalesce(p.selected, 0) as selected,
    p.top_path_score
from int_trees__summarized as t
left join path_counts as p using (run_id, tree_id)
