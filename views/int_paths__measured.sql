-- Per candidate root-to-leaf path: its nodes and the four metrics of SPEC §3, unweighted.
-- grain: tree_id, leaf_id
-- sources: int_nodes__final, int_nodes__created, int_edges__scored, run_config
--
-- Candidates: root -> every leaf as of now (the final leaves once a tree is done).
-- Metrics are over the path without its root: mean edge cleanliness and knowledge,
-- mean and max oriented node score. A path is ranked only if every such node has a
-- score and every edge a knowledge value (the layer-1/2 exemptions can leave nulls).
-- avg_score and max_score are reported raw (for minimize: the mean raw score and
-- the raw score of the best node). Means add root to leaf, whatever the row order.
with nodes as (
    select n.*, c.edge_id as creating_edge_id
    from int_nodes__final as n
    inner join int_nodes__created as c using (tree_id, node_id)
    where n.is_now
),

leaves as (
    select tree_id, node_id as leaf_id, depth, leaf_reason
    from nodes
    where depth > 0 and leaf_reason is not null
),

steps as (
    select
        l.tree_id,
        l.leaf_id,
        n.node_id,
        n.depth,
        n.score_o,
        e.cleanliness,
        e.knowledge
    from leaves as l
    inner join nodes as n
        on
            l.tree_id = n.tree_id
            and (l.leaf_id = n.node_id or starts_with(l.leaf_id, n.node_id || '.'))
    left join int_edges__scored as e on n.tree_id = e.tree_id and n.creating_edge_id = e.edge_id
)

select
    s.tree_id,
    s.leaf_id,
    l.depth,
    l.leaf_reason,
    list(s.node_id order by s.depth) as node_ids,
    count(*) filter (where s.depth > 0 and (s.score_o is null or s.knowledge is null)) = 0
        as ranked,
    avg(s.cleanliness order by s.depth) filter (where s.depth > 0) as avg_cleanliness,
    avg(s.knowledge order by s.depth) filter (where s.depth > 0) as avg_knowledge,
    avg(s.score_o order by s.depth) filter (where s.depth > 0) as avg_score_o,
    max(s.score_o) filter (where s.depth > 0) as max_score_o,
    any_value(c.sign) as sign
from steps as s
inner join leaves as l using (tree_id, leaf_id)
cross join run_config as c
group by s.tree_id, s.leaf_id, l.depth, l.leaf_reason
