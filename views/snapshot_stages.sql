-- Per task and stage: candidates, eligible, quota, quota picks and fills (ALGORITHM §1.7-1.10).
-- grain: run_id, task, stage
-- sources: int_snapshots__staged, int_snapshots__picked, int_snapshots__quotas
with now_staged as (
    select * from int_snapshots__staged
    where is_now
),

staged as (
    select
        run_id,
        task,
        stage,
        count(*) as candidates,
        count(*) filter (where is_eligible) as eligible
    from now_staged
    group by all
),

picked as (
    select
        p.run_id,
        p.task,
        p.stage,
        count(*) filter (where p.selection_reason = 'quota') as picked_quota,
        count(*) filter (where p.selection_reason = 'fill') as fills
    from int_snapshots__picked as p
    semi join now_staged as s using (run_id, task, asof_seq)
    group by all
),

final as (
    select
        t.run_id,
        t.task,
        q.stage,
        q.stage_order,
        q.quota,
        coalesce(s.candidates, 0) as candidates,
        coalesce(s.eligible, 0) as eligible,
        coalesce(p.picked_quota, 0) as picked_quota,
        coalesce(p.fills, 0) as fills,
        coalesce(p.picked_quota, 0) + coalesce(p.fills, 0) as picked
    from (select distinct run_id, task from now_staged) as t
    inner join int_snapshots__quotas as q on t.run_id = q.run_id
    left join staged as s on t.run_id = s.run_id and t.task = s.task and q.stage = s.stage
    left join picked as p on t.run_id = p.run_id and t.task = p.task and q.stage = p.stage
)

select * from final
