-- Which eligible snapshots are picked, by stage quota or by fill (ALGORITHM §1.8-1.10).
-- grain: run_id, task, asof_seq, snapshot
-- sources: int_snapshots__staged, int_snapshots__quotas
-- materialized: table
--
-- Evenly spaced pick of k from a list of n: positions ((2j+1)·n) // (2k) for
-- j = 0..k-1 (integer arithmetic), all of them when k >= n. The summed deficit
-- of starved stages goes middle -> late -> early, each stage taking up to its
-- unpicked eligible count, evenly spaced over its unpicked eligible snapshots.
-- Per evaluation point of int_snapshots__points.
with eligible as (
    select
        run_id,
        task,
        asof_seq,
        snapshot,
        stage,
        row_number() over (
            partition by run_id, task, asof_seq, stage order by global_index, snapshot
        ) - 1 as pos
    from int_snapshots__staged
    where is_eligible
),

stage_counts as (
    select
        t.run_id,
        t.task,
        t.asof_seq,
        q.stage,
        q.fill_order,
        q.quota,
        count(e.snapshot) as n_eligible
    from (select distinct run_id, task, asof_seq from int_snapshots__staged) as t
    inner join int_snapshots__quotas as q on t.run_id = q.run_id
    left join eligible as e
        on t.run_id = e.run_id and t.task = e.task and t.asof_seq = e.asof_seq and q.stage = e.stage
    group by all
),

quota_positions as (
    select
        run_id,
        task,
        asof_seq,
        stage,
        case
            when quota >= n_eligible then j
            else ((2 * j + 1) * n_eligible) // (2 * quota)
        end as pos
    from (
        select
            *,
            unnest(range(least(quota, n_eligible))) as j
        from stage_counts
    )
),

quota_picks as (
    select
        e.run_id,
        e.task,
        e.asof_seq,
        e.snapshot,
        e.stage,
        e.pos
    from eligible as e
    semi join quota_positions as p
        on
            e.run_id = p.run_id
            and e.task = p.task
            and e.asof_seq = p.asof_seq
            and e.stage = p.stage
            and e.pos = p.pos
),

fill_sizes as (
    select
        run_id,
        task,
        asof_seq,
        stage,
        greatest(0, n_eligible - quota) as unpicked,
        cast(
            sum(greatest(0, quota - n_eligible)) over (partition by run_id, task, asof_seq) as bigint
        ) as deficit,
        cast(coalesce(
            sum(greatest(0, n_eligible - quota)) over (
                partition by run_id, task, asof_seq order by fill_order
                rows between unbounded preceding and 1 preceding
            ),
            0
        ) as bigint) as available_before
    from stage_counts
),

fill_counts as (
    select
        run_id,
        task,
        asof_seq,
        stage,
        unpicked,
        greatest(0, least(unpicked, deficit - available_before)) as extra
    from fill_sizes
),

unpicked as (
    select
        e.run_id,
        e.task,
        e.asof_seq,
        e.snapshot,
        e.stage,
        row_number() over (partition by e.run_id, e.task, e.asof_seq, e.stage order by e.pos) - 1 as upos
    from eligible as e
    anti join quota_picks as q
        on e.run_id = q.run_id and e.task = q.task and e.asof_seq = q.asof_seq and e.snapshot = q.snapshot
),

fill_positions as (
    select
        run_id,
        task,
        asof_seq,
        stage,
        ((2 * j + 1) * unpicked) // (2 * extra) as upos
    from (
        select
            *,
            unnest(range(extra)) as j
        from fill_counts
        where extra > 0
    )
),

fill_picks as (
    select
        u.run_id,
        u.task,
        u.asof_seq,
        u.snapshot,
        u.stage
    from unpicked as u
    semi join fill_positions as p
        on
            u.run_id = p.run_id
            and u.task = p.task
            and u.asof_seq = p.asof_seq
            and u.stage = p.stage
            and u.upos = p.upos
),

final as (
    select run_id, task, asof_seq, snapshot, stage, 'quota' as selection_reason from quota_picks
    union all
    select run_id, task, asof_seq, snapshot, stage, 'fill' as selection_reason from fill_picks
)

select * from final
