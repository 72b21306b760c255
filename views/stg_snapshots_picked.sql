-- SnapshotsPicked decisions: the roots chosen for a task .
-- grain: seq
-- sources: events
select
    seq,
    watermark,
    task,
    detail
from events
where kind = 'snapshots_picked'
