-- BlockGranted facts: the blocks of valid edges a campaign granted each tree of this run.
-- grain: run_id, seq
-- sources: log_block_granted
select
    run_id,
    seq,
    tree_id,
    edges,
    round
from log_block_granted
where in_prefix(seq) and in_scope(tree_id)
