-- One row for the whole run, as of now: trees done and running, edges by verdict, leaves.
-- grain: run_key
-- sources: int_trees__summarized, nodes, int_turns
--
-- The edge counts add up the trees view's (int_trees__summarized: the trees view
-- without its paths, so this one-row view costs little to read while a run goes on);
-- kept_edges includes the kept_exempt_edges. tool_calls, tool_errors and
-- knowledge_actions add up the finished turns' (int_turns).
select
    1 as run_key,
    count(*) as trees,
    count(*) filter (where status = 'done') as trees_done,
    count(*) filter (where status <> 'done') as trees_running,
    coalesce(sum(kept_edges), 0) as kept_edges,
    coalesce(sum(kept_exempt_edges), 0) as kept_exempt_edges,
    coalesce(sum(pruned_edges), 0) as pruned_edges,
    coalesce(sum(retried_edges), 0) as retried_edges,
    coalesce(sum(in_flight_edges), 0) as in_flight_edges,
    (select count(*) from nodes where leaf_reason is not null) as leaves,
    (select coalesce(sum(tool_calls), 0) from int_turns) as tool_calls,
    (select coalesce(sum(tool_errors), 0) from int_turns) as tool_errors,
    (select coalesce(sum(knowledge_actions), 0) from int_turns) as knowledge_actions
from int_trees__summarized
