-- TurnSkipped decisions: turn 2 not run because the edge could no longer be kept.
-- grain: run_id, seq
-- sources: log_turn_skipped
select
    run_id,
    seq,
    watermark,
    tree_id,
    edge_id,
    turn,
    reason
from log_turn_skipped
where in_prefix(seq) and in_scope(tree_id)
