-- MessageWritten facts: text and reasoning parts (their text stays in the Parquet log).
-- grain: run_id, seq
-- sources: log_message_written
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    step,
    part
from log_message_written
where in_prefix(seq) and in_scope(tree_id)
