-- Per tree whose stop condition holds now and whose stop is not recorded yet: the stop due (ALGORITHM §2).
-- grain: run_id, tree_id
-- sources: int_trees__asof, stg_tree_stopped
--
-- The engine records a TreeStopped decision for each row, with the tree's as-of
-- seq as its watermark (the prefix at which the condition was read).
select
    t.run_id,
    t.tree_id,
    t.asof_seq,
    t.stop_reason
from int_trees__asof as t
anti join stg_tree_stopped as s using (run_id, tree_id)
where t.is_now and t.stop_reason is not null
