-- One row per candidate root-to-leaf path of paths (selected or not), node on it and turn of the edge that made it.
-- grain: run_id, tree_id, leaf_id, depth, turn
-- sources: paths, int_nodes__created, nodes, int_turns, edges, stg_conversation_recorded
--
-- The walk of int_path_turns over the paths as of now rather than a recorded
-- selection's: the root (depth 0, turn 0, no edge), then each node's creating edge's
-- turns in order, so any path's conversation, selected or not, is the cut-and-append
-- of its turns' recorded conversations in this order (has_conversation: the turn
-- recorded one). Each row carries its edge's verdict and the parts that decided it
-- (the edges view's), and the path's selected and rank.
with path_nodes as (
    select
        run_id,
        tree_id,
        leaf_id,
        selected,
        rank,
        unnest(node_ids) as node_id
    from paths
),

conversations as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        count(*) as conversations,
        any_value(recorder) as recorder
    from stg_conversation_recorded
    group by all
)

select
    pn.run_id,
    pn.tree_id,
    pn.leaf_id,
    pn.selected,
    pn.rank,
    pn.node_id,
    n.depth,
    n.score as node_score,
    n.tok as node_tok,
    c.edge_id,
    coalesce(t.turn, 0) as turn,
    t.session_id,
    t.score,
    t.eval_status,
    t.outcome,
    t.tool_calls,
    t.tool_errors,
    t.steps,
    t.context_tokens,
    e.verdict,
    e.s1,
    e.s2,
    e.soft,
    e.improved,
    e.outcome as edge_outcome,
    e.cleanliness,
    e.knowledge,
    e.regression_stability,
    coalesce(v.conversations, 0) > 0 as has_conversation,
    v.recorder
from path_nodes as pn
inner join int_nodes__created as c using (run_id, tree_id, node_id)
inner join nodes as n using (run_id, tree_id, node_id)
left join edges as e on e.run_id = c.run_id and e.tree_id = c.tree_id and e.edge_id = c.edge_id
left join int_turns as t on t.run_id = c.run_id and t.tree_id = c.tree_id and t.edge_id = c.edge_id
left join conversations as v on v.run_id = t.run_id and v.tree_id = t.tree_id and v.edge_id = t.edge_id and v.turn = t.turn
