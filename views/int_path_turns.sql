-- One row per recorded path and node on it, and per turn of the edge that made the node: what export walks.
-- grain: run_id, selection_id, tree_id, leaf_id, depth, turn
-- sources: int_paths__recorded, int_node_turns
--
-- Root to leaf, each node's turns as int_node_turns walks them (the root at depth 0,
-- turn 0, no edge), so the conversation of a path is the cut-and-append of its
-- turns' recorded conversations in this order.
with path_nodes as (
    select
        p.run_id,
        p.selection_id,
        p.tree_id,
        p.leaf_id,
        unnest(p.node_ids) as node_id
    from int_paths__recorded as p
)

select
    pn.run_id,
    pn.selection_id,
    pn.tree_id,
    pn.leaf_id,
    pn.node_id,
    w.* exclude (run_id, tree_id, node_id)
from path_nodes as pn
inner join int_node_turns as w using (run_id, tree_id, node_id)
