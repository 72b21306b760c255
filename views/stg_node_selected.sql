-- NodeSelected decisions: the node chosen for each free slot, with its scores.
-- grain: run_id, seq
-- sources: log_node_selected
select
    run_id,
    seq,
    watermark,
    tree_id,
    node_id,
    select_score,
    q,
    t
from log_node_selected
where in_prefix(seq) and in_scope(tree_id)
