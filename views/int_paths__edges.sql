-- Per candidate path and edge on it (root to leaf): the edge that created each node of the path.
-- grain: run_id, tree_id, leaf_id, depth
-- sources: paths, nodes
--
-- The paths of now under the current weighting (the paths view). path_length is
-- the number of edges on the path (the leaf's depth): L_p of ALGORITHM §5.
with path_nodes as (
    select
        p.run_id,
        p.tree_id,
        p.leaf_id,
        p.selected,
        len(p.node_ids) - 1 as path_length,
        unnest(p.node_ids) as node_id
    from paths as p
)

select
    pn.run_id,
    pn.tree_id,
    pn.leaf_id,
    n.depth,
    n.node_id,
    n.edge_id,
    pn.path_length,
    pn.selected
from path_nodes as pn
inner join nodes as n on pn.run_id = n.run_id and pn.tree_id = n.tree_id and pn.node_id = n.node_id
where n.depth > 0
