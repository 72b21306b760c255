-- One row per candidate root-to-leaf path with its ranks, PathScore and Top-k rank (public, ALGORITHM §3, §7).
-- grain: run_id, tree_id, leaf_id
-- sources: int_paths__selected, stg_root_added
-- materialized: table
--
-- The paths as of now, scored with the current weighting (int_path_weightings:
-- the run config's weights and top_k, or the path_* variables of a reselection).
-- avg_score_rank and max_score_rank are mid-rank pct among the ranked paths of the
-- same root; ranked: every node of the path (root excluded) has a score and every
-- edge a knowledge value. avg_score and max_score are raw (for minimize: the mean
-- raw score, and the raw score of the best node); rank orders the ranked paths of
-- a root by path_score (ties: smallest leaf id); selected = rank <= top_k.
select
    p.run_id,
    p.tree_id,
    p.leaf_id,
    p.node_ids,
    p.ranked,
    p.avg_cleanliness,
    p.avg_knowledge,
    p.avg_score_o * p.sign as avg_score,
    p.avg_score_rank,
    p.max_score_o * p.sign as max_score,
    p.max_score_rank,
    p.path_score,
    p.rank,
    p.selected,
    root.task,
    root.stage,
    root.snapshot,
    p.depth,
    p.leaf_reason
from int_paths__selected as p
inner join stg_root_added as root using (run_id, tree_id)
where p.selection_seq = 0
