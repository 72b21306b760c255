-- What the run had spent as of each seq at which its spend grew: valid edges and tokens so far (public).
-- grain: run_id, seq
-- sources: int_edges__judged, int_turns__costs
--
-- The units of campaign_spend: kept_edges counts the edges kept or kept exempt (their
-- completion's seq), tokens every finished turn's (int_turns__costs.tokens, at the
-- turn's seq). The last row is campaign_spend's; the row at or before a seq is what a
-- reader of the log up to that seq saw (a campaign's round reads the runs at its marks).
with spent as (
    select
        run_id,
        completed_seq as seq,
        1 as kept_edges,
        0 as tokens
    from int_edges__judged
    where verdict in ('kept', 'kept_exempt')
    union all
    select
        run_id,
        finished_seq as seq,
        0 as kept_edges,
        tokens
    from int_turns__costs
),

by_seq as (
    select
        run_id,
        seq,
        sum(kept_edges) as kept_edges,
        sum(tokens) as tokens
    from spent
    group by run_id, seq
)

select
    run_id,
    seq,
    cast(sum(kept_edges) over (partition by run_id order by seq) as bigint) as kept_edges,
    cast(sum(tokens) over (partition by run_id order by seq) as bigint) as tokens
from by_seq
