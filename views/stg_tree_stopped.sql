-- TreeStopped decisions: the recorded stop of each tree.
-- grain: run_id, seq
-- sources: log_tree_stopped
select
    run_id,
    seq,
    watermark,
    tree_id,
    reason
from log_tree_stopped
where in_prefix(seq) and in_scope(tree_id)
