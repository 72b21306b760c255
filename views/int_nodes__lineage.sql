-- Per node, what it inherits from its ancestors: ref score, turn start score, path best (ALGORITHM §2).
-- grain: run_id, tree_id, node_id
-- sources: int_nodes__created
-- materialized: table
--
-- Ancestors are id prefixes (T.2 is an ancestor of T.2.1). ref_o: the node's own
-- oriented score, else the nearest ancestor's. start_o: the nearest last numeric
-- turn score on root..node (the snapshot score at the root). path_best_o: the best
-- oriented score on root..node.
with nodes as (
    select * from int_nodes__created
),

pairs as (
    select
        n.run_id,
        n.tree_id,
        n.node_id,
        a.depth as ancestor_depth,
        a.score_o as ancestor_score_o,
        a.last_turn_score_o as ancestor_turn_score_o
    from nodes as n
    inner join nodes as a
        on
            n.run_id = a.run_id
            and n.tree_id = a.tree_id
            and (n.node_id = a.node_id or starts_with(n.node_id, a.node_id || '.'))
),

final as (
    select
        run_id,
        tree_id,
        node_id,
        arg_max(ancestor_score_o, ancestor_depth) filter (where ancestor_score_o is not null)
            as ref_o,
        arg_max(ancestor_turn_score_o, ancestor_depth)
            filter (where ancestor_turn_score_o is not null) as start_o,
        max(ancestor_score_o) as path_best_o
    from pairs
    group by all
)

select * from final
