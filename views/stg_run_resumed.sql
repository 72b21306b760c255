-- RunResumed facts: a run was continued from its log.
-- grain: seq
-- sources: log_run_resumed
select
    seq,
    recorded_at,
    note
from log_run_resumed
where in_prefix(seq)
