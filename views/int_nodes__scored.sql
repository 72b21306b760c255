-- One row per node with its static selection inputs: lineage scores and process (SPEC §2).
-- grain: tree_id, node_id
-- sources: int_nodes__created, int_nodes__lineage, int_edges__scored
-- materialized: table
--
-- process(n) = mean of the non-null soft scores of the kept edges on root..n (0 if none).
with nodes as (
    select * from int_nodes__created
),

path_soft as (
    select
        n.tree_id,
        n.node_id,
        avg(e.soft) as mean_soft
    from nodes as n
    inner join int_edges__scored as e
        on
            n.tree_id = e.tree_id
            and (n.node_id = e.child_id or starts_with(n.node_id, e.child_id || '.'))
    group by all
),

final as (
    select
        n.*,
        l.ref_o,
        l.start_o,
        l.path_best_o,
        coalesce(p.mean_soft, 0.0) as process
    from nodes as n
    inner join int_nodes__lineage as l using (tree_id, node_id)
    left join path_soft as p using (tree_id, node_id)
)

select * from final
