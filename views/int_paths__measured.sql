-- Per candidate root-to-leaf path and point: its nodes, the four metrics of ALGORITHM §3 and their ranks.
-- grain: run_id, tree_id, asof_seq, leaf_id
-- sources: int_nodes__final, int_nodes__created, int_edges__scored, run_config
-- materialized: table
--
-- Candidates: root -> every leaf at the point (the final leaves once a tree is
-- done), at the points where paths are scored (now, and in replay the watermark
-- of every path selection). Metrics are over the path without its root: mean edge
-- cleanliness and knowledge, mean and max oriented node score. A path is ranked
-- only if every such node has a score and every edge a knowledge value (the
-- layer-1/2 exemptions can leave nulls). avg_score_rank and max_score_rank are
-- mid-rank pct among the ranked paths of the same root at the same point. Means
-- add root to leaf, whatever the row order.
with nodes as (
    select n.*, c.edge_id as creating_edge_id
    from int_nodes__final as n
    inner join int_nodes__created as c using (run_id, tree_id, node_id)
    where n.for_paths
),

leaves as (
    select run_id, tree_id, asof_seq, is_now, node_id as leaf_id, depth, leaf_reason
    from nodes
    where depth > 0 and leaf_reason is not null
),

steps as (
    select
        l.run_id,
        l.tree_id,
        l.asof_seq,
        l.leaf_id,
        n.node_id,
        n.depth,
        n.score_o,
        e.cleanliness,
        e.knowledge
    from leaves as l
    inner join nodes as n
        on
            l.run_id = n.run_id
            and l.tree_id = n.tree_id
            and l.asof_seq = n.asof_seq
            and (l.leaf_id = n.node_id or starts_with(l.leaf_id, n.node_id || '.'))
    left join int_edges__scored as e
        on n.run_id = e.run_id and n.tree_id = e.tree_id and n.creating_edge_id = e.edge_id
),

measured as (
    select
        s.run_id,
        s.tree_id,
        s.asof_seq,
        s.leaf_id,
        l.is_now,
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
    inner join leaves as l using (run_id, tree_id, asof_seq, leaf_id)
    inner join run_config as c using (run_id)
    group by s.run_id, s.tree_id, s.asof_seq, s.leaf_id, l.is_now, l.depth, l.leaf_reason
),

counts as (
    select
        a.run_id,
        a.tree_id,
        a.asof_seq,
        a.leaf_id,
        count(*) filter (where b.avg_score_o < a.avg_score_o) as avg_less,
        count(*) filter (where b.avg_score_o = a.avg_score_o) as avg_equal,
        count(*) filter (where b.max_score_o < a.max_score_o) as max_less,
        count(*) filter (where b.max_score_o = a.max_score_o) as max_equal,
        count(*) as total
    from measured as a
    inner join measured as b
        on a.run_id = b.run_id and a.tree_id = b.tree_id and a.asof_seq = b.asof_seq and b.ranked
    where a.ranked
    group by all
)

select
    m.*,
    pct(c.avg_less, c.avg_equal, c.total) as avg_score_rank,
    pct(c.max_less, c.max_equal, c.total) as max_score_rank
from measured as m
left join counts as c using (run_id, tree_id, asof_seq, leaf_id)
