-- TurnFinished facts: one per finished rollout turn, with context tokens and checkpoint.
-- grain: run_id, seq
-- sources: log_turn_finished
select
    run_id,
    seq,
    recorded_at,
    tree_id,
    edge_id,
    turn,
    session_id,
    context_tokens,
    outcome,
    error,
    state,
    started_at,
    wall_seconds,
    startup_seconds,
    model_seconds,
    tool_seconds,
    eval_seconds,
    lost_server
from log_turn_finished
where in_prefix(seq) and in_scope(tree_id)
