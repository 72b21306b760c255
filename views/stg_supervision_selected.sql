-- SupervisionSelected decisions: recorded preference pairs, unpaired labels and step labels.
-- grain: run_id, seq
-- sources: log_supervision_selected
select
    run_id,
    seq,
    watermark,
    selection_id,
    rule,
    min_margin,
    threshold,
    pairs,
    labels,
    step_paths
from log_supervision_selected
where in_prefix(seq)
