-- The error messages of failed tool calls, grouped by their normalized form, most frequent first.
-- grain: run_id, message
-- sources: failures
--
-- message: the error with paths, hex ids, numbers and quoted text replaced by
-- placeholders (the failures view's message); share: of all failed calls; tools:
-- the tools that failed with it; example: one message as it was (the first in the log).
with failed as (
    select run_id, message, tool, error, seq
    from failures
    where kind = 'tool'
)

select
    run_id,
    message,
    count(*) as errors,
    count(*) / sum(count(*)) over (partition by run_id) as share,
    list(distinct tool order by tool) as tools,
    arg_min(error, seq) as example
from failed
group by run_id, message
