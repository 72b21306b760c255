-- ToolCalled facts: one row per tool call of a rollout turn.
-- grain: run_id, seq
-- sources: log_tool_called
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    step,
    call_id,
    tool,
    status,
    target,
    error
from log_tool_called
where in_prefix(seq) and in_scope(tree_id)
