-- Recorded stops of the run the prefix they saw does not imply, and stops that were due but missing (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_run_stopped, stg_edge_started, stg_run_finished, int_grader_checks, int_edges__eval_errors, run_config
--
-- The stop due at a point is the one int_run__stopping gives at the prefix the point
-- saw: a RunStopped at its watermark (a stop consumed by an earlier RunStopped is not
-- due again), an EdgeStarted or RunFinished at the seq before it. A stop must be due
-- with its reason and error; no edge may start and the run may not finish while a
-- stop is due, nor while the newest grader check before it did not pass.
-- The newest check and verdict at a point's watermark are found by ASOF joins (a
-- range join kept every earlier verdict of every point: quadratic in the edges).
with points as (
    select run_id, seq, watermark, 'stop' as point, reason || ': ' || error as recorded, 'run' as subject
    from stg_run_stopped
    union all
    select run_id, seq, seq - 1 as watermark, 'edge' as point, null as recorded, edge_id as subject
    from stg_edge_started
    union all
    select run_id, seq, seq - 1 as watermark, 'finish' as point, null as recorded, 'run' as subject
    from stg_run_finished
),

checks as (
    select
        p.run_id,
        p.seq,
        c.seq as since_seq,
        c.outcome,
        c.problem
    from points as p
    asof inner join int_grader_checks as c on c.run_id = p.run_id and c.seq <= p.watermark
),

edges as (
    select
        p.run_id,
        p.seq,
        e.judged_seq as since_seq,
        e.streak,
        e.stop_error
    from points as p
    asof inner join int_edges__eval_errors as e on e.run_id = p.run_id and e.judged_seq <= p.watermark
),

due as (
    select run_id, seq, since_seq, 'grader_check: ' || problem as derived
    from checks
    where outcome <> 'passed'
    union all
    select e.run_id, e.seq, e.since_seq, 'eval_errors: ' || e.stop_error as derived
    from edges as e
    inner join run_config as r using (run_id)
    where e.streak >= r.eval_error_limit
),

open_due as (
    select d.*
    from due as d
    where not exists (
        select 1 from stg_run_stopped as s
        where s.run_id = d.run_id and s.seq > d.since_seq and s.seq < d.seq
    )
),

stops as (
    select
        p.run_id,
        p.seq,
        p.subject,
        p.recorded,
        coalesce(
            max(d.derived) filter (where d.derived = p.recorded), min(d.derived), 'running'
        ) as derived
    from points as p
    left join open_due as d using (run_id, seq)
    where p.point = 'stop'
    group by all
),

failed_checks as (
    select run_id, seq, 'grader_check: ' || problem as derived
    from checks
    where outcome <> 'passed'
),

late as (
    select
        p.run_id,
        p.seq,
        p.subject,
        case when p.point = 'edge' then 'edge started while the run was due to stop'
            else 'run finished while it was due to stop' end as problem,
        null as recorded,
        d.derived
    from points as p
    inner join (
        select run_id, seq, derived from open_due
        union
        select run_id, seq, derived from failed_checks
    ) as d using (run_id, seq)
    where p.point in ('edge', 'finish')
)

select run_id, seq, 'run_stopped' as kind, cast(null as varchar) as tree_id, subject,
    case when derived = 'running' then 'stopped with no stop due' else 'stop reason or error differs' end
        as problem,
    recorded, derived
from stops
where derived <> recorded
union all
select run_id, seq, 'run_stopped' as kind, cast(null as varchar) as tree_id, subject, problem, recorded, derived
from late
