-- The campaign's tasks, each with the run that explores it, in the order the file lists them.
-- grain: task
-- sources: stg_campaign_task_added
select
    seq,
    row_number() over (order by seq) as task_order,
    task,
    task_run,
    source
from stg_campaign_task_added
