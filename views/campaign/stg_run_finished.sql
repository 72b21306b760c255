-- RunFinished facts of the campaign log: the campaign ended normally.
-- grain: seq
-- sources: log_run_finished
select
    seq,
    outcome
from log_run_finished
