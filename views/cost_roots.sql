-- Per root: what exploring it cost - tokens by kind, model calls, turns, wall time, the backend's cost.
-- grain: run_id, tree_id
-- sources: trees, int_turns__costs
--
-- Every turn of the tree counts, those of pruned and retried attempts included.
-- wall/startup/model/tool_seconds: sums over the turns that measured them (null: none did, never 0;
-- turn_phases). tokens_per_selected_path: the tree's tokens over its selected paths (what one
-- training sample from this root cost to make; null without a selected path).
with costs as (
    select
        run_id,
        tree_id,
        count(*) as turns,
        sum(steps) as steps,
        sum(tokens_input) as tokens_input,
        sum(tokens_cached) as tokens_cached,
        sum(tokens_output) as tokens_output,
        sum(tokens_reasoning) as tokens_reasoning,
        sum(tokens) as tokens,
        sum(cost order by edge_id, turn) as cost,
        sum(wall_seconds order by edge_id, turn) as wall_seconds,
        sum(startup_seconds order by edge_id, turn) as startup_seconds,
        sum(model_seconds order by edge_id, turn) as model_seconds,
        sum(tool_seconds order by edge_id, turn) as tool_seconds
    from int_turns__costs
    group by all
)

select
    t.run_id,
    t.tree_id,
    t.task,
    t.stage,
    coalesce(c.turns, 0) as turns,
    coalesce(c.steps, 0) as steps,
    coalesce(c.tokens_input, 0) as tokens_input,
    coalesce(c.tokens_cached, 0) as tokens_cached,
    coalesce(c.tokens_output, 0) as tokens_output,
    coalesce(c.tokens_reasoning, 0) as tokens_reasoning,
    coalesce(c.tokens, 0) as tokens,
    coalesce(c.cost, 0.0) as cost,
    c.wall_seconds,
    c.startup_seconds,
    c.model_seconds,
    c.tool_seconds,
    t.selected as selected_paths,
    case when t.selected > 0
        then c.tokens / t.selected
    end as tokens_per_selected_path
from trees as t
left join costs as c using (run_id, tree_id)
