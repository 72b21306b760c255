-- RunStarted facts: the command and the whole recorded configuration of the run.
-- grain: run_id, seq
-- sources: log_run_started
select
    run_id,
    seq,
    recorded_at,
    command,
    task,
    direction,
    config,
    tool_version,
    teacher_version
from log_run_started
where in_prefix(seq)
