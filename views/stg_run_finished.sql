-- RunFinished facts: a run ended normally.
-- grain: run_id, seq
-- sources: log_run_finished
select
    run_id,
    seq,
    recorded_at,
    outcome
from log_run_finished
where in_prefix(seq)
