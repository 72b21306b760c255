-- Where a run's turn time goes: p50, p95 and share of each phase, over all turns and per node (public).
-- grain: run_id, node, phase
-- sources: turn_phases
--
-- One row per phase (wall, startup, model, tools, eval, other: phase_order 1-6) for
-- node '*' (every turn) and, when turns ran on more than one node, for each node:
-- turns is the turns that measured the phase, p50/p95 its quantiles (continuous),
-- total its seconds and share total / the wall seconds of the same turns. A start-up share near or above the model's means the
-- turns wait on process starts, not on the model (see docs/REAL_RUNS.md).
with phases as (
    select
        t.run_id,
        t.node,
        p.phase,
        p.phase_order,
        p.seconds,
        t.wall_seconds
    from turn_phases as t
    cross join lateral (
        values
            ('wall', 1, t.wall_seconds),
            ('startup', 2, t.startup_seconds),
            ('model', 3, t.model_seconds),
            ('tools', 4, t.tool_seconds),
            ('eval', 5, t.eval_seconds),
            ('other', 6, t.other_seconds)
    ) as p (phase, phase_order, seconds)
    where p.seconds is not null
),

everywhere as (
    select run_id, '*' as node, phase, phase_order, seconds, wall_seconds from phases
    union all
    select run_id, node, phase, phase_order, seconds, wall_seconds from phases as x
    where (select count(distinct node) from phases as y where y.run_id = x.run_id) > 1
)

select
    run_id,
    node,
    phase,
    phase_order,
    count(*) as turns,
    round(quantile_cont(seconds, 0.5), 3) as p50_seconds,
    round(quantile_cont(seconds, 0.95), 3) as p95_seconds,
    round(sum(seconds order by seconds), 3) as total_seconds,
    round(sum(seconds order by seconds) / nullif(sum(wall_seconds order by wall_seconds), 0), 4) as share
from everywhere
group by run_id, node, phase, phase_order
