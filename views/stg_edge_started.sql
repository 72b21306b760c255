-- EdgeStarted facts: every edge attempt launched.
-- grain: run_id, edge_id
-- sources: log_edge_started
select
    run_id,
    seq,
    recorded_at,
    tree_id,
    edge_id,
    parent_id,
    slot,
    attempt
from log_edge_started
where in_prefix(seq) and in_scope(tree_id)
