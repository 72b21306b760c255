-- Where the campaign stands: its rounds, the last one, its stop and whether it finished.
-- grain: campaign_key
-- sources: stg_budget_allocated, stg_campaign_stopped, stg_run_finished
select
    1 as campaign_key,
    (select count(*) from stg_budget_allocated) as rounds,
    (select max(round) from stg_budget_allocated) as last_round,
    (select any_value(reason) from stg_campaign_stopped) as stop_reason,
    (select count(*) from stg_run_finished) > 0 as finished
