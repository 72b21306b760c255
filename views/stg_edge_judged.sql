-- EdgeJudged decisions: the recorded verdict of each finished edge attempt.
-- grain: run_id, seq
-- sources: log_edge_judged
select
    run_id,
    seq,
    recorded_at,
    watermark,
    tree_id,
    edge_id,
    verdict,
    child_id
from log_edge_judged
where in_prefix(seq) and in_scope(tree_id)
