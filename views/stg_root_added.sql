-- RootAdded facts: the root snapshot of every tree.
-- grain: run_id, tree_id
-- sources: log_root_added
select
    run_id,
    seq,
    tree_id,
    task,
    snapshot,
    path,
    global_index,
    agent_id,
    commit_hash,
    score,
    stage,
    selection_reason
from log_root_added
where in_prefix(seq) and in_scope(tree_id)
