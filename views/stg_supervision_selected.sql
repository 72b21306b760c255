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
    coalesce(against_verdict, 'keep') as against_verdict,  -- recorded before the rule had it: kept
    pairs,
    labels,
    step_paths
from log_supervision_selected
where in_prefix(seq)
