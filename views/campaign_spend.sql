-- What a campaign's run has spent of its budget: valid edges, tokens, and the trees still growing.
-- grain: run_key
-- sources: trees, cost_roots, stg_block_granted
--
-- kept_edges: valid edges (verdict kept or kept_exempt) over every tree, the unit of
-- a campaign's edge budget; tokens: every turn's (int_turns__costs.tokens, through
-- cost_roots), the unit of its token budget; granted_edges: what BlockGranted gave.
select
    1 as run_key,
    (select count(*) from trees) as trees,
    (select count(*) from trees where status = 'running') as running_trees,
    (select coalesce(sum(kept_edges), 0) from trees) as kept_edges,
    (select coalesce(sum(tokens), 0) from cost_roots) as tokens,
    (select coalesce(sum(edges), 0) from stg_block_granted) as granted_edges
