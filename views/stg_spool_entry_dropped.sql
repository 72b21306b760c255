-- SpoolEntryDropped facts: a spooled turn that was not taken (another run's, stale or damaged).
-- grain: run_id, seq
-- sources: log_spool_entry_dropped
select
    run_id,
    seq,
    recorded_at,
    tree_id,
    edge_id,
    turn,
    reason
from log_spool_entry_dropped
where in_prefix(seq) and in_scope(tree_id)
