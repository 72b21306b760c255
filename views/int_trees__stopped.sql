-- Each tree's stop: its first recorded TreeStopped decision, with its reason and seq.
-- grain: run_id, tree_id
-- sources: stg_tree_stopped
select
    run_id,
    tree_id,
    reason as stop_reason,
    seq as stopped_seq
from stg_tree_stopped
qualify row_number() over (partition by run_id, tree_id order by seq) = 1
