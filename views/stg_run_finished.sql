-- RunFinished facts: a run ended normally.
-- grain: seq
-- sources: log_run_finished
select
    seq,
    recorded_at,
    outcome
from log_run_finished
where in_prefix(seq)
