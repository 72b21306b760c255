-- Recorded tree stops the prefix they saw does not imply, edges started after a stop,
-- and finished runs with a done tree never stopped (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_tree_stopped, int_trees__stopped, stg_edge_started, int_run__finished, int_trees__asof
--
-- Needs `set variable asof_points = 'decisions'` (replay sets it).
with checked as (
    select
        r.run_id,
        r.seq,
        r.tree_id,
        r.tree_id as subject,
        case
            when t.tree_id is null or t.stop_reason is null then 'stopped too early'
            when t.stop_reason <> r.reason then 'stop reason differs'
        end as problem,
        r.reason as recorded,
        coalesce(t.stop_reason, 'running') as derived
    from stg_tree_stopped as r
    left join int_trees__asof as t
        on r.run_id = t.run_id and r.tree_id = t.tree_id and r.watermark = t.asof_seq
),

late_starts as (
    select
        e.run_id,
        e.seq,
        e.tree_id,
        e.edge_id as subject,
        'edge started after the tree stopped' as problem,
        'started' as recorded,
        'stopped at seq ' || s.stopped_seq as derived
    from stg_edge_started as e
    inner join int_trees__stopped as s
        on e.run_id = s.run_id and e.tree_id = s.tree_id and e.seq > s.stopped_seq
),

unstopped as (
    select
        t.run_id,
        null as seq,
        t.tree_id,
        t.tree_id as subject,
        'no stop recorded' as problem,
        null as recorded,
        t.stop_reason as derived
    from int_trees__asof as t
    anti join stg_tree_stopped as r using (run_id, tree_id)
    inner join int_run__finished as f using (run_id)
    where t.is_now and t.is_done and f.finished
)

select run_id, seq, 'tree_stopped' as kind, tree_id, subject, problem, recorded, derived
from checked
where problem is not null
union all
select run_id, seq, 'tree_stopped' as kind, tree_id, subject, problem, recorded, derived from late_starts
union all
select run_id, seq, 'tree_stopped' as kind, tree_id, subject, problem, recorded, derived from unstopped
