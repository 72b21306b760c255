-- CampaignStopped decisions: the round from which the campaign grants no more, and why.
-- grain: seq
-- sources: log_campaign_stopped
select
    seq,
    watermark,
    round,
    marks,
    reason
from log_campaign_stopped
