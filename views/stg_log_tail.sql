-- The seq of the last event in the log prefix (0 for an empty log).
-- grain: asof_seq
-- sources: log_tail
--
-- Not about one event kind: "now" for the tree views. log_tail holds the largest
-- seq of the log (kept by the catalog as events arrive); seqs have no gaps, so
-- the prefix up to the watermark ends at the smaller of the two.
select least(seq, coalesce(getvariable('watermark'), seq)) as asof_seq
from log_tail
