-- ContentRecorded facts: each distinct system prompt and tool list a model received, once.
-- grain: run_id, seq
-- sources: log_content_recorded
--
-- The body stays in the Parquet log (export reads it); conversations refer to content_id.
select
    run_id,
    seq,
    content_id,
    content_kind
from log_content_recorded
where in_prefix(seq)
