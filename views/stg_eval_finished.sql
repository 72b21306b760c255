-- EvalFinished facts: the coral eval result of each turn (score null when no number).
-- grain: run_id, seq
-- sources: log_eval_finished
select
    run_id,
    seq,
    tree_id,
    edge_id,
    turn,
    score,
    eval_status,
    commit_hash,
    source,
    error
from log_eval_finished
where in_prefix(seq) and in_scope(tree_id)
