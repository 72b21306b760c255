-- One row per node and turn of the edge that made it: the steps every walk of a path takes.
-- grain: run_id, tree_id, node_id, turn
-- sources: int_nodes__created, nodes, int_turns, stg_conversation_recorded
--
-- The root is one row (turn 0, no edge); any other node, its creating edge's turns
-- (turn 2 forks turn 1's session, a child's turn 1 its parent's last turn), so the
-- conversation of a path is the cut-and-append of its nodes' turns' recorded
-- conversations in order (has_conversation: the turn recorded one). int_path_turns
-- walks the recorded selections' paths, path_turns the paths as of now. Node score
-- and tok are as of now; the turn columns are the turns view's.
with conversations as (
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
    c.run_id,
    c.tree_id,
    c.node_id,
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
from int_nodes__created as c
inner join nodes as n using (run_id, tree_id, node_id)
left join int_turns as t on t.run_id = c.run_id and t.tree_id = c.tree_id and t.edge_id = c.edge_id
left join conversations as v on v.run_id = t.run_id and v.tree_id = t.tree_id and v.edge_id = t.edge_id and v.turn = t.turn
