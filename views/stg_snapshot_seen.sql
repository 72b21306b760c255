-- SnapshotSeen facts: one row per entry of a scanned all_snapshots/ directory.
-- grain: task, snapshot
-- sources: events
select
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
    skip_reason
from events
where kind = 'snapshot_seen'
