-- The stop of the whole run that is due now and not recorded yet (no row when none is).
-- grain: run_id, reason
-- sources: int_grader_checks, int_edges__eval_errors, stg_run_stopped, run_config
--
-- grader_check: the newest check of the grader before the first turn did not pass.
-- eval_errors: the last judged edge ends a streak of eval_error_limit edges whose
-- every eval failed with the same error. Either is due until a RunStopped follows it;
-- the engine records one (RunStopped, its watermark the log's tail) and the run ends
-- with error (exit 1). A resume checks the grader again and counts a new streak.
with last_check as (
    select *
    from int_grader_checks
    qualify row_number() over (partition by run_id order by seq desc) = 1
),

last_edge as (
    select *
    from int_edges__eval_errors
    qualify row_number() over (partition by run_id order by judged_seq desc) = 1
),

due as (
    select
        c.run_id,
        'grader_check' as reason,
        c.problem as error,
        c.seq as since_seq
    from last_check as c
    where c.outcome <> 'passed'
    union all
    select
        e.run_id,
        'eval_errors' as reason,
        e.stop_error as error,
        e.judged_seq as since_seq
    from last_edge as e
    inner join run_config as r on e.run_id = r.run_id
    where e.streak >= r.eval_error_limit
)

select
    d.run_id,
    d.reason,
    d.error,
    d.since_seq
from due as d
where not exists (select 1 from stg_run_stopped as s where s.run_id = d.run_id and s.seq > d.since_seq)
