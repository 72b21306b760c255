-- What a campaign's run has spent of its budget: valid edges, tokens, and the trees still growing.
-- grain: run_id
-- sources: trees, cost_roots, stg_block_granted, run_config
--
-- kept_edges: valid edges (verdict kept or kept_exempt) over every tree, the unit of
-- a campaign's edge budget; tokens: every turn's (int_turns__costs.tokens, through
-- cost_roots), the unit of its token budget; granted_edges: what BlockGranted gave.
-- One row a run (run_config's), zeros before anything was spent.
with tree_counts as (
    select
        run_id,
        count(*) as trees,
        count(*) filter (where status = 'running') as running_trees,
        sum(kept_edges) as kept_edges
    from trees
    group by run_id
),

token_sums as (
    select run_id, sum(tokens) as tokens
    from cost_roots
    group by run_id
),

grants as (
    select run_id, sum(edges) as granted_edges
    from stg_block_granted
    group by run_id
)

select
    r.run_id,
    coalesce(t.trees, 0) as trees,
    coalesce(t.running_trees, 0) as running_trees,
    coalesce(t.kept_edges, 0) as kept_edges,
    coalesce(k.tokens, 0) as tokens,
    coalesce(g.granted_edges, 0) as granted_edges
from run_config as r
left join tree_counts as t on t.run_id = r.run_id
left join token_sums as k on k.run_id = r.run_id
left join grants as g on g.run_id = r.run_id
