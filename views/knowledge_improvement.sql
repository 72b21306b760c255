-- Per task: how often edges improved with and without knowledge actions (ALGORITHM §4, §5).
-- grain: run_id, task, measure, with_knowledge
-- sources: edges, turns, trees
--
-- Edges with a score (improved not null). measure any_action: the edge made at
-- least one knowledge action in either turn; both_turns: each turn made one (the
-- edge's has_knowledge, which the soft verifier uses). improved_rate = improved /
-- edges.
with actions as (
    select
        run_id,
        tree_id,
        edge_id,
        coalesce(sum(knowledge_actions), 0) > 0 as any_action
    from turns
    group by all
),

scored as (
    select
        e.run_id,
        coalesce(t.task, 'none') as task,
        e.improved,
        coalesce(a.any_action, false) as any_action,
        coalesce(e.has_knowledge, false) as both_turns
    from edges as e
    left join actions as a on e.run_id = a.run_id and e.tree_id = a.tree_id and e.edge_id = a.edge_id
    left join trees as t on e.run_id = t.run_id and e.tree_id = t.tree_id
    where e.improved is not null
),

measured as (
    select run_id, task, 'any_action' as measure, any_action as with_knowledge, improved from scored
    union all
    select run_id, task, 'both_turns', both_turns, improved from scored
)

select
    run_id,
    task,
    measure,
    with_knowledge,
    count(*) as edges,
    count(*) filter (where improved) as improved,
    count(*) filter (where improved) / count(*) as improved_rate
from measured
group by all
