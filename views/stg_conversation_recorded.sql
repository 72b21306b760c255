-- ConversationRecorded facts: per turn, the system prompt, tools and model calls of what the model received.
-- grain: run_id, seq
-- sources: log_conversation_recorded
--
-- The messages stay in the Parquet log (export reads them): a turn's conversation is
-- the inherited one cut at base, followed by its messages (ingest/events.py).
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    system_id,
    tools_id,
    base,
    turn_start,
    model_calls,
    workspace,
    recorder
from log_conversation_recorded
where in_prefix(seq) and in_scope(tree_id)
