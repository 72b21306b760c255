-- The campaign's decisions, round by round: each round's blocks (BudgetAllocated) and its stop (CampaignStopped).
-- grain: seq
-- sources: stg_budget_allocated, stg_campaign_stopped
--
-- marks is each run's tail (run id -> seq) when the round read the runs' views;
-- blocks and edges count the round's grants, granted_edges the edges granted up to and
-- including the round. The stop's rule is 'stop', its reason budget_spent or trees_stopped.
with decisions as (
    select
        seq,
        watermark,
        round,
        rule,
        marks,
        grants,
        json_array_length(grants) as blocks,
        coalesce((
            select sum(cast(g ->> 'edges' as bigint))
            from (select unnest(cast(grants as json[])) as g)
        ), 0) as edges,
        null as reason
    from stg_budget_allocated
    union all
    select
        seq,
        watermark,
        round,
        'stop' as rule,
        marks,
        null as grants,
        0 as blocks,
        0 as edges,
        reason
    from stg_campaign_stopped
)

select
    *,
    cast(sum(edges) over (order by seq) as bigint) as granted_edges
from decisions
