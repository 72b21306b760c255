-- Every event of the run up to the watermark variable (all events when it is unset).
-- grain: seq
-- sources: event_log
--
-- The only view that reads event_log. `set variable watermark = n` makes every
-- view in the catalog see the log prefix 1..n; replay uses it.
select *
from event_log
where seq <= coalesce(getvariable('watermark'), 9223372036854775807)
