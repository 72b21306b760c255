-- RunStarted facts of the campaign log: the campaign's configuration (command campaign).
-- grain: seq
-- sources: log_run_started
select
    seq,
    command,
    config,
    tool_version
from log_run_started
