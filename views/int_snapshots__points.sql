-- The points at which snapshot selection is evaluated: now, plus every recorded pick in replay.
-- grain: run_id, task, asof_seq
-- sources: stg_snapshot_seen, stg_snapshots_picked, stg_log_tail
--
-- "now" is the last seq of the prefix; with `set variable asof_points = 'decisions'`
-- the watermark of every SnapshotsPicked decision is a point of its task, so the
-- recorded pick is re-derived from the snapshot facts it saw (replay).
with tasks as (
    select distinct run_id, task from stg_snapshot_seen
),

points as (
    select
        t.run_id,
        t.task,
        tail.asof_seq,
        true as is_now
    from tasks as t
    inner join stg_log_tail as tail on t.run_id = tail.run_id
    union all
    select
        run_id,
        task,
        watermark as asof_seq,
        false as is_now
    from stg_snapshots_picked
    where coalesce(getvariable('asof_points'), 'now') = 'decisions'
)

select
    run_id,
    task,
    asof_seq,
    bool_or(is_now) as is_now
from points
group by all
