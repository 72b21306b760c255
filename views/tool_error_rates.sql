-- Tool-error rate per tool, tree, stage, task, turn and step of the turn (ALGORITHM §2, §5).
-- grain: run_id, dimension, key
-- sources: tool_calls, trees
--
-- A call failed when OpenCode reported an error or the tool does not exist (see the
-- tool_calls view). dimension is tool, tree, stage, task, turn (1 or 2) or step (the
-- model call within the turn); error_rate = errors / calls.
with calls as (
    select
        c.run_id,
        c.tool,
        c.tree_id,
        coalesce(t.stage, 'none') as stage,
        coalesce(t.task, 'none') as task,
        cast(c.turn as varchar) as turn,
        cast(c.step as varchar) as step,
        c.status = 'error' as failed
    from tool_calls as c
    left join trees as t using (run_id, tree_id)
),

keyed as (
    select run_id, 'tool' as dimension, tool as key, failed from calls
    union all
    select run_id, 'tree', tree_id, failed from calls
    union all
    select run_id, 'stage', stage, failed from calls
    union all
    select run_id, 'task', task, failed from calls
    union all
    select run_id, 'turn', turn, failed from calls
    union all
    select run_id, 'step', step, failed from calls
)

select
    run_id,
    dimension,
    key,
    count(*) as calls,
    count(*) filter (where failed) as errors,
    count(*) filter (where failed) / count(*) as error_rate
from keyed
group by all
