-- One row per failure in an attempt: a tool call whose result is an error, or an eval that crashed or timed out.
-- grain: run_id, seq
-- sources: tool_calls, stg_eval_finished
--
-- What the viewer marks and counts as a failure (kind 'tool': the tool_calls row of a
-- call whose status is error, its tool, call_id and error; kind 'eval': an EvalFinished
-- whose status is crashed or timeout, its error when it said why). seq is the event's:
-- a turn's failures in the order they happened. message: a failed call's error with what varies
-- replaced by placeholders (normalized_message), the key tool_error_messages groups by (null for an eval).
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    'tool' as kind,
    call_id,
    tool,
    status,
    error,
    normalized_message(coalesce(error, 'error without a message')) as message
from tool_calls
where status = 'error'
union all
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    'eval' as kind,
    null as call_id,
    null as tool,
    eval_status as status,
    error,
    null as message
from stg_eval_finished
where eval_status in ('crashed', 'timeout')
