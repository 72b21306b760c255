-- Per task and stage: candidates, eligible, quota, quota picks and fills (ALGORITHM §1.7-1.10).
-- grain: task, stage
-- sources: int_snapshots__staged, int_snapshots__picked, int_snapshots__quotas
with now_staged as (
    select * from int_snapshots__staged
    where is_now
),

staged as (
    select
        task,
        stage,
        count(*) as candidates,
        count(*) filter (where is_eligible) as eligible
    from now_staged
    group by all
),

picked as (
    select
        p.task,
        p.stage,
        count(*) filter (where p.selection_reason = 'quota') as picked_quota,
        count(*) filter (where p.selection_reason = 'fill') as fills
    from int_snapshots__picked as p
    semi join now_staged as s using (task, asof_seq)
    group by all
),

final as (
    select
        t.task,
        q.stage,
        q.stage_order,
        q.quota,
        coalesce(s.candidates, 0) as candidates,
        coalesce(s.eligible, 0) as eligible,
        coalesce(p.picked_quota, 0) as picked_quota,
        coalesce(p.fills, 0) as fills,
        coalesce(p.picked_quota, 0) + coalesce(p.fills, 0) as picked
    from (select distinct task from now_staged) as t
    cross join int_snapshots__quotas as q
    left join staged as s on t.task = s.task and q.stage = s.stage
    left join picked as p on t.task = p.task and q.stage = p.stage
)

select * from final
