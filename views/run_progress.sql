-- One row for the whole run, as of now: trees done and running, edges by verdict, leaves.
-- grain: run_key
-- sources: trees, edges, nodes
select
    1 as run_key,
    (select count(*) from trees) as trees,
    (select count(*) from trees where status = 'done') as trees_done,
    (select count(*) from trees where status <> 'done') as trees_running,
    (select count(*) from edges where verdict = 'kept') as edges_kept,
    (select count(*) from edges where verdict = 'kept_exempt') as edges_kept_exempt,
    (select count(*) from edges where verdict = 'pruned') as edges_pruned,
    (select count(*) from edges where verdict = 'retry') as edges_retried,
    (select count(*) from edges where verdict is null) as edges_in_flight,
    (select count(*) from nodes where leaf_reason is not null) as leaves
