-- One row for the whole run, as of now: trees done and running, edges by verdict, leaves.
-- grain: run_key
-- sources: trees, edges, nodes
--
-- The edge counts add up the trees view's (one definition, one read of trees).
select
    1 as run_key,
    count(*) as trees,
    count(*) filter (where status = 'done') as trees_done,
    count(*) filter (where status <> 'done') as trees_running,
    coalesce(sum(edges_kept), 0) as edges_kept,
    coalesce(sum(edges_kept_exempt), 0) as edges_kept_exempt,
    coalesce(sum(edges_pruned), 0) as edges_pruned,
    coalesce(sum(edges_retried), 0) as edges_retried,
    (select count(*) from edges where verdict is null) as edges_in_flight,
    (select count(*) from nodes where leaf_reason is not null) as leaves
from trees
