-- The campaign's configuration as typed columns, read from its log's first RunStarted event.
-- grain: campaign_key
-- sources: stg_run_started
--
-- config_json is the configuration as recorded (engine.campaign.config.CampaignConfig).
-- Budgets not given are null.
select
    1 as campaign_key,
    json_extract_string(config, '$.policy') as policy,
    cast(json_extract_string(config, '$.parallel') as bigint) as parallel,
    cast(json_extract_string(config, '$.budget.edges') as bigint) as budget_edges,
    cast(json_extract_string(config, '$.budget.tokens') as bigint) as budget_tokens,
    cast(json_extract_string(config, '$.coverage.first_pass_edges') as bigint) as first_pass_edges,
    cast(json_extract_string(config, '$.coverage.block_edges') as bigint) as block_edges,
    cast(json_extract_string(config, '$.coverage.blocks_per_round') as bigint) as blocks_per_round,
    config as config_json,
    tool_version
from stg_run_started
order by seq
limit 1
