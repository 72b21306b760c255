-- Recorded skips of turn 2 the facts do not imply, and skips that are due but missing (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_turn_skipped, int_edges__judged
--
-- A skip is due when turn 1 has no score and the edge can no longer be kept; it
-- must come after turn 1 finished, and no turn 2 may follow it.
with checked as (
    select
        r.run_id,
        r.seq,
        r.tree_id,
        r.edge_id as subject,
        case
            when d.turn1_seq is null or d.turn1_seq > r.watermark
                then 'skipped before turn 1 finished'
            when not d.skip_turn2 then 'turn 2 was owed'
            when d.turn2_seq is not null then 'turn 2 ran after the skip'
        end as problem,
        'skip turn 2' as recorded,
        case when d.skip_turn2 then 'skip turn 2' else 'run turn 2' end as derived
    from stg_turn_skipped as r
    left join int_edges__judged as d using (run_id, tree_id, edge_id)
),

missing as (
    select
        d.run_id,
        d.turn1_seq as seq,
        d.tree_id,
        d.edge_id as subject,
        'no skip recorded' as problem,
        null as recorded,
        'skip turn 2' as derived
    from int_edges__judged as d
    anti join stg_turn_skipped as r using (run_id, tree_id, edge_id)
    where d.skip_turn2
)

select run_id, seq, 'turn_skipped' as kind, tree_id, subject, problem, recorded, derived
from checked
where problem is not null
union all
select run_id, seq, 'turn_skipped' as kind, tree_id, subject, problem, recorded, derived
from missing
