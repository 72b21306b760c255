-- RunStopped decisions: the run stopped before its trees were done, and why.
-- grain: seq
-- sources: log_run_stopped
select
    seq,
    watermark,
    reason,
    error
from log_run_stopped
where in_prefix(seq)
