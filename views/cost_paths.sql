-- Per selected path: the cost of the turns on it (both turns of every edge root to leaf).
-- grain: run_id, tree_id, leaf_id
-- sources: int_paths__edges, int_turns__costs
--
-- The phases' seconds are sums over the turns that measured them (null: none did; turn_phases).
select
    e.run_id,
    e.tree_id,
    e.leaf_id,
    any_value(e.path_length) as path_length,
    count(*) as turns,
    sum(c.steps) as steps,
    sum(c.tokens_input) as tokens_input,
    sum(c.tokens_cached) as tokens_cached,
    sum(c.tokens_output) as tokens_output,
    sum(c.tokens_reasoning) as tokens_reasoning,
    sum(c.tokens) as tokens,
    sum(c.cost order by e.depth, c.turn) as cost,
    sum(c.wall_seconds order by e.depth, c.turn) as wall_seconds,
    sum(c.startup_seconds order by e.depth, c.turn) as startup_seconds,
    sum(c.model_seconds order by e.depth, c.turn) as model_seconds,
    sum(c.tool_seconds order by e.depth, c.turn) as tool_seconds
from int_paths__edges as e
inner join int_turns__costs as c on e.run_id = c.run_id and e.tree_id = c.tree_id and e.edge_id = c.edge_id
where e.selected
group by e.run_id, e.tree_id, e.leaf_id
