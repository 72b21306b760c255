-- The seq of the last event in each run's log prefix (no row for an empty log).
-- grain: run_id
-- sources: log_tail
--
-- Not about one event kind: "now" for the tree views. log_tail holds each run's largest
-- seq (kept by the catalog as events arrive); seqs have no gaps, so the prefix up to
-- the watermark ends at the smaller of the two.
select
    run_id,
    least(seq, coalesce(getvariable('watermark'), seq)) as asof_seq
from log_tail
