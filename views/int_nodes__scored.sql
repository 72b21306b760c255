-- One row per node with its static selection inputs: lineage scores and process (ALGORITHM §2).
-- grain: run_id, tree_id, node_id
-- sources: int_nodes__created, int_nodes__lineage, int_edges__scored
-- materialized: table
--
-- process(n) = mean of the non-null soft scores of the kept edges on root..n (0 if none).
-- The mean is a correlated subquery so that a refresh of a few trees reads only
-- their edges (a grouped CTE behind a left join is computed for every tree), and
-- adds root to node, whatever the physical row order.
with nodes as (
    select * from int_nodes__created
),

final as (
    select
        n.*,
        l.ref_o,
        l.start_o,
        l.path_best_o,
        coalesce(
            (
                select avg(e.soft order by e.completed_seq)
                from int_edges__scored as e
                where
                    e.run_id = n.run_id
                    and e.tree_id = n.tree_id
                    and (n.node_id = e.child_id or starts_with(n.node_id, e.child_id || '.'))
            ),
            0.0
        ) as process
    from nodes as n
    inner join int_nodes__lineage as l using (run_id, tree_id, node_id)
)

select * from final
