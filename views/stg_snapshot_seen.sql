-- SnapshotSeen facts: one row per entry of a scanned all_snapshots/ dir or CORAL run.
-- grain: run_id, task, snapshot
-- sources: log_snapshot_seen
select
    run_id,
    seq,
    task,
    snapshot,
    path,
    global_index,
    agent_id,
    short_hash,
    commit_hash,
    eval_count,
    eval_ok,
    eval_ok_json,
    score,
    score_problem,
    attempt_file,
    attempt_status,
    shared_state_hash,
    skip_reason
from log_snapshot_seen
where in_prefix(seq)
