-- One row per node of every tree, as of now: depth, score, tok, ranks, Q and leaf reason (public, ALGORITHM §7).
-- grain: run_id, tree_id, node_id
-- sources: int_nodes__final, run_config
--
-- score is raw (null under the layer-1/2 exemptions); leaf_reason is null unless
-- the node is a leaf; t and select are set for active candidates only.
select
    n.run_id,
    n.tree_id,
    n.node_id,
    n.parent_id,
    n.depth,
    n.score,
    n.tok,
    n.valid_children,
    n.failed_expansions,
    n.process,
    n.score_rank,
    n.best_rank,
    n.q,
    n.leaf_reason,
    n.is_active,
    n.in_flight,
    n.t,
    n.select_score as "select",
    n.path_best_o * c.sign as path_best,
    n.edge_id,
    n.created_seq
from int_nodes__final as n
inner join run_config as c on n.run_id = c.run_id
where n.is_now
