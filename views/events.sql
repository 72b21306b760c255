-- Every event of the run (light columns) up to the watermark variable, for ad-hoc SQL.
-- grain: run_id, seq
-- sources: event_log
--
-- `set variable watermark = n` makes every view in the catalog see the log prefix
-- 1..n (staging views filter event_log with the macro in_prefix); replay uses it.
select *
from event_log
where in_prefix(seq)
