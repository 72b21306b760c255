-- Knowledge actions by area and access, per edge, tree, stage and task (ALGORITHM §4).
-- grain: run_id, dimension, key, area, access
-- sources: tool_calls, trees
--
-- area and access are the tool_calls view's knowledge_area and knowledge_access.
-- dimension is all, task, stage, tree or edge; actions counts the calls, edges the
-- distinct edge attempts with one.
with actions as (
    select
        c.run_id,
        c.tree_id,
        c.edge_id,
        c.knowledge_area as area,
        c.knowledge_access as access,
        coalesce(t.stage, 'none') as stage,
        coalesce(t.task, 'none') as task
    from tool_calls as c
    left join trees as t using (run_id, tree_id)
    where c.is_knowledge
),

keyed as (
    select 'all' as dimension, 'all' as key, * from actions
    union all
    select 'task', task, * from actions
    union all
    select 'stage', stage, * from actions
    union all
    select 'tree', tree_id, * from actions
    union all
    select 'edge', edge_id, * from actions
)

select
    run_id,
    dimension,
    key,
    area,
    access,
    count(*) as actions,
    count(distinct edge_id) as edges
from keyed
group by run_id, dimension, key, area, access
