-- Recorded edge verdicts the facts do not imply, and finished edges never judged (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_edge_judged, int_edges__judged, int_run__finished
--
-- Replay reads every audit_* view. A verdict must equal the derived one, name the
-- derived child id, come after the edge was complete (completed_seq <= watermark)
-- and be the only one for its edge. A complete edge without a verdict is missing once
-- the engine judged after it (a later EdgeJudged: every pass judges every edge due) or
-- the run finished; a prefix that ends between a batch's turns and its verdicts (a run
-- interrupted there, whose resume judges them first) misses nothing.
with recorded as (
    select
        *,
        count(*) over (partition by run_id, tree_id, edge_id) as times
    from stg_edge_judged
),

checked as (
    select
        r.run_id,
        r.seq,
        r.tree_id,
        r.edge_id as subject,
        case
            when d.completed_seq is null or d.completed_seq > r.watermark
                then 'judged before the edge was complete'
            when r.times > 1 then 'judged more than once'
            when r.verdict is distinct from d.verdict then 'verdict differs'
            when r.child_id is distinct from d.child_id then 'child id differs'
        end as problem,
        r.verdict || coalesce(' -> ' || r.child_id, '') as recorded,
        coalesce(d.verdict, 'not complete') || coalesce(' -> ' || d.child_id, '') as derived
    from recorded as r
    left join int_edges__judged as d using (run_id, tree_id, edge_id)
),

missing as (
    select
        d.run_id,
        d.completed_seq as seq,
        d.tree_id,
        d.edge_id as subject,
        'no verdict recorded' as problem,
        null as recorded,
        d.verdict || coalesce(' -> ' || d.child_id, '') as derived
    from int_edges__judged as d
    anti join stg_edge_judged as r using (run_id, tree_id, edge_id)
    where
        d.verdict is not null
        and (
            (select f.finished from int_run__finished as f where f.run_id = d.run_id)
            or exists (
                select 1 from stg_edge_judged as later
                where later.run_id = d.run_id and later.seq > d.completed_seq
            )
        )
)

select run_id, seq, 'edge_judged' as kind, tree_id, subject, problem, recorded, derived
from checked
where problem is not null
union all
select run_id, seq, 'edge_judged' as kind, tree_id, subject, problem, recorded, derived
from missing
