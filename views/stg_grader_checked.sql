-- GraderChecked facts: the task's grader graded a root's own code before the first turn.
-- grain: run_id, seq
-- sources: log_grader_checked
select
    run_id,
    seq,
    recorded_at,
    tree_id,
    commit_hash,
    score,
    recorded_score,
    eval_status,
    error
from log_grader_checked
where in_prefix(seq)
