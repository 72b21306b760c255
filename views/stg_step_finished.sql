-- StepFinished facts: one row per assistant step (model call) of a turn.
-- grain: run_id, seq
-- sources: log_step_finished
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    step,
    reason,
    tokens_input,
    tokens_output,
    tokens_reasoning,
    tokens_cache_read,
    tokens_cache_write,
    tokens_total,
    cost
from log_step_finished
where in_prefix(seq) and in_scope(tree_id)
