-- One row per recorded path and node on it, and per turn of the edge that made the node: what export walks.
-- grain: run_id, selection_id, tree_id, leaf_id, depth, turn
-- sources: int_paths__recorded, int_nodes__created, nodes, int_turns, stg_conversation_recorded
--
-- Root to leaf: the root (depth 0, turn 0, no edge), then each node's creating edge's
-- turns in order (turn 2 forks turn 1's session, a child's turn 1 its parent's last
-- turn), so the conversation of a path is the cut-and-append of its turns'
-- recorded conversations in this order (has_conversation: the turn recorded one).
-- Node score and tok are as of now; the turn columns are the turns view's.
with path_nodes as (
    select
        p.run_id,
        p.selection_id,
        p.tree_id,
        p.leaf_id,
        unnest(p.node_ids) as node_id
    from int_paths__recorded as p
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
),

walked as (
    select
        pn.run_id,
        pn.selection_id,
        pn.tree_id,
        pn.leaf_id,
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
        coalesce(v.conversations, 0) > 0 as has_conversation,
        v.recorder
    from path_nodes as pn
    inner join int_nodes__created as c using (run_id, tree_id, node_id)
    inner join nodes as n using (run_id, tree_id, node_id)
    left join int_turns as t on t.run_id = c.run_id and t.tree_id = c.tree_id and t.edge_id = c.edge_id
    left join conversations as v on v.run_id = t.run_id and v.tree_id = t.tree_id and v.edge_id = t.edge_id and v.turn = t.turn
)

select * from walked
