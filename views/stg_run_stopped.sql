-- RunStopped decisions: the run stopped before its trees were done, and why.
-- grain: run_id, seq
-- sources: log_run_stopped
select
    run_id,
    seq,
    watermark,
    reason,
    error
from log_run_stopped
where in_prefix(seq)
