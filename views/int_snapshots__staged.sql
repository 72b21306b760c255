-- Candidate snapshots with score_for_stage, centred smoothing, gain and stage (ALGORITHM §1.3-1.6).
-- grain: run_id, task, asof_seq, snapshot
-- sources: int_snapshots__points, stg_snapshot_seen, run_config
-- materialized: table
--
-- At every evaluation point (int_snapshots__points): the candidates among the
-- snapshot facts up to that seq.
-- Oriented scores (o = s, or -s for minimize). Fractions of N use integer
-- arithmetic: ceil(0.05N) = (N+19)//20, ceil(0.20N) = (N+4)//5,
-- floor(0.10N+0.5) = (N+5)//10, floor(0.50N+0.5) = (N+1)//2.
with candidates as (
    select
        p.run_id,
        p.asof_seq,
        p.is_now,
        s.* exclude (run_id),
        oriented(s.score, c.direction) as oriented_score
    from int_snapshots__points as p
    inner join stg_snapshot_seen as s
        on p.run_id = s.run_id and p.task = s.task and s.seq <= p.asof_seq
    inner join run_config as c on p.run_id = c.run_id
    where s.skip_reason is null
),

ordered as (
    select
        *,
        row_number() over (
            partition by run_id, task, asof_seq order by global_index, snapshot
        ) - 1 as i,
        count(*) over (partition by run_id, task, asof_seq) as n
    from candidates
),

filled as (
    select
        *,
        coalesce(
            oriented_score,
            last_value(oriented_score ignore nulls) over (
                partition by run_id, task, asof_seq order by i rows between unbounded preceding and 1 preceding
            ),
            first_value(oriented_score ignore nulls) over (
                partition by run_id, task, asof_seq order by i rows between 1 following and unbounded following
            )
        ) as score_for_stage
    from ordered
),

smoothed as (
    select
        *,
        avg(score_for_stage) over (
            partition by run_id, task, asof_seq order by i rows between 2 preceding and 2 following
        ) as smooth
    from filled
),

levels as (
    select
        run_id,
        task,
        asof_seq,
        avg(smooth) filter (where i < greatest(1, (n + 19) // 20)) as s0,
        avg(smooth) filter (where i >= n - greatest(1, (n + 4) // 5)) as s_inf
    from smoothed
    group by run_id, task, asof_seq
),

gained as (
    select
        s.*,
        l.s0,
        l.s_inf,
        l.s_inf > l.s0 as uses_gain,
        case
            when l.s_inf > l.s0
                then least(1.0, greatest(0.0, (s.smooth - l.s0) / (l.s_inf - l.s0)))
        end as gain
    from smoothed as s
    inner join levels as l on s.run_id = l.run_id and s.task = l.task and s.asof_seq = l.asof_seq
),

final as (
    select
        *,
        case
            when uses_gain and gain < 0.5 then 'early'
            when uses_gain and gain < 0.9 then 'middle'
            when uses_gain then 'late'
            when i < (n + 5) // 10 then 'early'
            when i < (n + 1) // 2 then 'middle'
            else 'late'
        end as stage,
        coalesce(eval_ok, false) and score is not null as is_eligible
    from gained
)

select * from final
