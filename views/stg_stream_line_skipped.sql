-- StreamLineSkipped facts: Teacher stream lines that could not be used.
-- grain: run_id, seq
-- sources: log_stream_line_skipped
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    line_no,
    problem
from log_stream_line_skipped
where in_prefix(seq) and in_scope(tree_id)
