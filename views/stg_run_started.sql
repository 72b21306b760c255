-- RunStarted facts: the command and the whole recorded configuration of the run.
-- grain: seq
-- sources: events
select
    seq,
    command,
    task,
    direction,
    config,
    tool_version
from events
where kind = 'run_started'
