-- One row per edge attempt with every derived field and its verdict (public, ALGORITHM §7).
-- grain: run_id, tree_id, edge_id
-- sources: int_edges__started
--
-- Scores are raw. verdict and child_id are null while the edge is in flight;
-- child_id is null unless the edge was kept (kept or kept_exempt).
select
    run_id,
    tree_id,
    edge_id,
    parent_id,
    child_id,
    layer,
    slot,
    attempt,
    s1,
    s2,
    eval_ok,
    edge_score,
    tool_calls,
    tool_errors,
    tool_error_rate,
    has_knowledge,
    improved,
    outcome,
    cleanliness,
    knowledge,
    regression_stability,
    soft,
    tok,
    steps,
    verdict,
    skip_turn2,
    started_seq,
    completed_seq
from int_edges__started
