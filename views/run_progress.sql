-- One row for the whole run, as of now: trees done and running, edges by verdict, leaves.
-- grain: run_id
-- sources: run_config, int_trees__summarized, nodes, int_turns
--
-- The edge counts add up the trees view's (int_trees__summarized: the trees view
-- without its paths, so this view of one row a run costs little to read while a run goes on);
-- kept_edges includes the kept_exempt_edges. tool_calls, tool_errors and
-- knowledge_actions add up the finished turns' (int_turns).
with tree_counts as (
    select
        run_id,
        count(*) as trees,
        count(*) filter (where status = 'done') as trees_done,
        count(*) filter (where status <> 'done') as trees_running,
        sum(kept_edges) as kept_edges,
        sum(kept_exempt_edges) as kept_exempt_edges,
        sum(pruned_edges) as pruned_edges,
        sum(retried_edges) as retried_edges,
        sum(in_flight_edges) as in_flight_edges
    from int_trees__summarized
    group by run_id
),

leaf_counts as (
    select run_id, count(*) as leaves
    from nodes
    where leaf_reason is not null
    group by run_id
),

turn_sums as (
    select
        run_id,
        sum(tool_calls) as tool_calls,
        sum(tool_errors) as tool_errors,
        sum(knowledge_actions) as knowledge_actions
    from int_turns
    group by run_id
)

select
    c.run_id,
    coalesce(t.trees, 0) as trees,
    coalesce(t.trees_done, 0) as trees_done,
    coalesce(t.trees_running, 0) as trees_running,
    coalesce(t.kept_edges, 0) as kept_edges,
    coalesce(t.kept_exempt_edges, 0) as kept_exempt_edges,
    coalesce(t.pruned_edges, 0) as pruned_edges,
    coalesce(t.retried_edges, 0) as retried_edges,
    coalesce(t.in_flight_edges, 0) as in_flight_edges,
    coalesce(l.leaves, 0) as leaves,
    coalesce(u.tool_calls, 0) as tool_calls,
    coalesce(u.tool_errors, 0) as tool_errors,
    coalesce(u.knowledge_actions, 0) as knowledge_actions
from run_config as c
left join tree_counts as t on c.run_id = t.run_id
left join leaf_counts as l on c.run_id = l.run_id
left join turn_sums as u on c.run_id = u.run_id
