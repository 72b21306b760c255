-- RunStarted facts: the command and the whole recorded configuration of the run.
-- grain: seq
-- sources: log_run_started
select
    seq,
    recorded_at,
    command,
    task,
    direction,
    config,
    tool_version
from log_run_started
where in_prefix(seq)
