-- SnapshotsPicked decisions: the roots chosen for a task .
-- grain: run_id, seq
-- sources: log_snapshots_picked
select
    run_id,
    seq,
    watermark,
    task,
    detail
from log_snapshots_picked
where in_prefix(seq)
