-- PathsSelected decisions: recorded Top-k path selections.
-- grain: run_id, seq
-- sources: log_paths_selected
select
    run_id,
    seq,
    watermark,
    selection_id,
    weights,
    top_k,
    paths
from log_paths_selected
where in_prefix(seq)
