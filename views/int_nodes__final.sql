-- Per evaluation point and node: the leaf reason including 'stopped' for a finished tree (ALGORITHM §2).
-- grain: run_id, tree_id, asof_seq, node_id
-- sources: int_nodes__asof, int_trees__asof
--
-- Once a tree has stopped and nothing is in flight, every childless non-root node
-- is a final leaf; those without another reason get 'stopped'.
select
    n.*,
    coalesce(
        n.open_leaf_reason,
        case when t.is_done and n.depth > 0 and n.valid_children = 0 then 'stopped' end
    ) as leaf_reason,
    t.is_done as tree_done
from int_nodes__asof as n
inner join int_trees__asof as t using (run_id, tree_id, asof_seq)
