-- SnapshotsPicked decisions: the roots chosen for a task .
-- grain: seq
-- sources: log_snapshots_picked
select
    seq,
    watermark,
    task,
    detail
from log_snapshots_picked
where in_prefix(seq)
