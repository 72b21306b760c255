-- One row per candidate root-to-leaf path of paths (selected or not), node on it and turn of the edge that made it.
-- grain: run_id, tree_id, leaf_id, depth, turn
-- sources: paths, int_node_turns, edges
--
-- The walk of int_path_turns over the paths as of now rather than a recorded
-- selection's (each node's turns as int_node_turns walks them), so any path's
-- conversation, selected or not, is the cut-and-append of its turns' recorded
-- conversations in this order. Each row carries its edge's verdict and the parts
-- that decided it (the edges view's), and the path's selected and rank.
with path_nodes as (
    select
        run_id,
        tree_id,
        leaf_id,
        selected,
        rank,
        unnest(node_ids) as node_id
    from paths
)

select
    pn.run_id,
    pn.tree_id,
    pn.leaf_id,
    pn.selected,
    pn.rank,
    pn.node_id,
    w.* exclude (run_id, tree_id, node_id, has_conversation, recorder),
    e.verdict,
    e.s1,
    e.s2,
    e.soft,
    e.improved,
    e.outcome as edge_outcome,
    e.cleanliness,
    e.knowledge,
    e.regression_stability,
    w.has_conversation,
    w.recorder
from path_nodes as pn
inner join int_node_turns as w using (run_id, tree_id, node_id)
left join edges as e on e.run_id = w.run_id and e.tree_id = w.tree_id and e.edge_id = w.edge_id
