-- Per rule, every root-to-leaf path of kept edges with each edge's value and label (ALGORITHM §3).
-- grain: run_id, selection_seq, tree_id, leaf_id
-- sources: int_attempts__valued
--
-- The leaves are the nodes a kept edge created that no kept edge leaves, at the rule's
-- watermark (every final leaf once the tree is done). A path's edges are the kept edges
-- that created the leaf and its ancestors, root to leaf (a node's id extends its
-- parent's). The lists are in that order.
with kept as (
    select *
    from int_attempts__valued
    where child_id is not null
),

leaves as (
    select k.run_id, k.selection_seq, k.tree_id, k.child_id as leaf_id, k.task, k.stage
    from kept as k
    anti join kept as below
        on
            k.run_id = below.run_id
            and k.selection_seq = below.selection_seq
            and k.tree_id = below.tree_id
            and below.node_id = k.child_id
)

select
    l.run_id,
    l.selection_seq,
    l.tree_id,
    l.leaf_id,
    any_value(l.task) as task,
    any_value(l.stage) as stage,
    count(*) as steps,
    list(k.edge_id order by k.layer) as edge_ids,
    list(k.value order by k.layer) as step_values,
    list(k.label order by k.layer) as step_labels,
    bool_and(k.recorded) as recorded
from leaves as l
inner join kept as k
    on
        l.run_id = k.run_id
        and l.selection_seq = k.selection_seq
        and l.tree_id = k.tree_id
        and (l.leaf_id = k.child_id or starts_with(l.leaf_id, k.child_id || '.'))
group by l.run_id, l.selection_seq, l.tree_id, l.leaf_id
