-- CampaignTaskAdded facts: a task of the campaign and the run that explores it.
-- grain: seq
-- sources: log_campaign_task_added
select
    seq,
    task,
    task_run,
    source
from log_campaign_task_added
