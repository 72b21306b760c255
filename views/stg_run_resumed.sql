-- RunResumed facts: a run was continued from its log.
-- grain: run_id, seq
-- sources: log_run_resumed
select
    run_id,
    seq,
    recorded_at,
    note,
    teacher_version
from log_run_resumed
where in_prefix(seq)
