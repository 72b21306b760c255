-- Recorded snapshot picks that the snapshot facts they saw do not imply (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_snapshots_picked, int_snapshots__staged, int_snapshots__picked
--
-- Needs `set variable asof_points = 'decisions'` (replay sets it): each recorded
-- SnapshotsPicked decision is re-derived at its watermark, where every candidate
-- of its task must have the recorded stage, gain (within 1e-9), pick and reason.
with recorded_lists as (
    select
        run_id,
        seq,
        task,
        from_json(
            detail,
            '[{"snapshot": "VARCHAR", "stage": "VARCHAR", "gain": "DOUBLE", '
            || '"selected": "BOOLEAN", "reason": "VARCHAR"}]'
        ) as candidates
    from stg_snapshots_picked
),

recorded as (
    -- unnest in the select list: a lateral unnest of from_json parsed the list per element
    select
        run_id,
        seq,
        task,
        unnest(candidates, recursive := true)
    from recorded_lists
),

derived as (
    select
        r.run_id,
        r.seq,
        s.task,
        s.snapshot,
        s.stage,
        s.gain,
        p.snapshot is not null as selected,
        p.selection_reason as reason
    from stg_snapshots_picked as r
    inner join int_snapshots__staged as s
        on r.run_id = s.run_id and r.task = s.task and r.watermark = s.asof_seq
    left join int_snapshots__picked as p
        on s.run_id = p.run_id and s.task = p.task and s.asof_seq = p.asof_seq and s.snapshot = p.snapshot
),

compared as (
    select
        coalesce(r.run_id, d.run_id) as run_id,
        coalesce(r.seq, d.seq) as seq,
        coalesce(r.snapshot, d.snapshot) as subject,
        case
            when d.snapshot is null then 'not derived'
            when r.snapshot is null then 'not recorded'
            when
                r.stage is distinct from d.stage
                or differs_or_missing(r.gain, d.gain)
                or r.selected is distinct from d.selected
                or r.reason is distinct from d.reason
                then 'differs'
        end as problem,
        case when r.snapshot is not null
            then format('stage={}, gain={}, selected={}, reason={}', r.stage, r.gain, r.selected, r.reason)
        end as recorded,
        case when d.snapshot is not null
            then format('stage={}, gain={}, selected={}, reason={}', d.stage, d.gain, d.selected, d.reason)
        end as derived
    from recorded as r
    full outer join derived as d on r.run_id = d.run_id and r.seq = d.seq and r.snapshot = d.snapshot
)

select
    run_id, seq, 'snapshots_picked' as kind, cast(null as varchar) as tree_id, subject, problem, recorded, derived
from compared
where problem is not null
