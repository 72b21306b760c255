-- Per tree of a campaign's run: the expected gain in lineage-aware N_eff per token of its next block (coverage policy).
-- grain: run_id, tree_id
-- sources: trees, coverage, learnability, cost_roots, stg_block_granted, run_config
--
-- What a campaign's coverage policy ranks trees by (docs/CAMPAIGNS.md; the choice is
-- engine.campaign's, recorded as BudgetAllocated). A block is grant_block_edges = b
-- valid edges. n_eff is the tree's lineage-aware N_eff, the audit's (coverage,
-- stratum root); K = top_k bounds it. Yield per valid edge: rate = (n_eff + prior *
-- b) / (kept_edges + b), the prior being the run's opened trees' (sum n_eff + 1) /
-- (sum kept_edges + max_depth): a tree with little history counts as its run's, and
-- a run without paths yet as one path per max_depth edges. expected_n_eff = b * rate
-- * (1 - n_eff / K), at least 0: what one more block adds. Its value is what it adds
-- to ln(1 + N_eff of the tree's stage in this run) - the concave transform that
-- makes a stage already covered gain less - times weight (grant_flagged_weight
-- for a root outside the learnability band, never or always; 1 otherwise).
-- tokens_per_edge = (tokens + prior * b) / (kept_edges + b) with the run's opened
-- trees' tokens per kept edge as prior; expected_tokens = b * tokens_per_edge; gain
-- = value per million expected tokens (null when no token was spent yet).
-- eligible: the tree is running (no stop holds). Rows for every tree of the run;
-- the gains are null in a run whose trees are not granted (run_config.granted).
with cfg as (
    select
        run_id,
        top_k,
        max_depth,
        grant_block_edges as b,
        grant_flagged_weight as flagged_weight
    from run_config
),

granted as (
    select run_id, tree_id, sum(edges) as granted_edges
    from stg_block_granted
    group by all
),

per_tree as (
    select
        t.run_id,
        t.tree_id,
        t.task,
        coalesce(t.stage, 'none') as stage,
        t.status = 'running' as eligible,
        t.kept_edges,
        coalesce(g.granted_edges, 0) as granted_edges,
        c.tokens,
        coalesce(r.n_eff, 0.0) as n_eff,
        l.band
    from trees as t
    left join granted as g on g.run_id = t.run_id and g.tree_id = t.tree_id
    left join cost_roots as c on c.run_id = t.run_id and c.tree_id = t.tree_id
    left join learnability as l on l.run_id = t.run_id and l.tree_id = t.tree_id
    left join coverage as r on r.run_id = t.run_id and r.stratum = 'root' and r.stratum_key = t.tree_id
),

run_priors as (
    select
        p.run_id,
        (coalesce(sum(p.n_eff order by p.tree_id), 0.0) + 1.0)
        / (coalesce(sum(p.kept_edges), 0) + any_value(cfg.max_depth)) as rate,
        sum(p.tokens) / greatest(sum(p.kept_edges), 1) as tokens_per_edge
    from per_tree as p
    inner join cfg on cfg.run_id = p.run_id
    where p.granted_edges > 0
    group by p.run_id
),

priors as (
    -- one row a run: null rate and tokens_per_edge
    -- when no tree was granted yet (any_value and sum over no rows are null)
    select
        cfg.run_id,
        rp.rate,
        rp.tokens_per_edge
    from cfg
    left join run_priors as rp on rp.run_id = cfg.run_id
),

stages as (
    select run_id, stage, sum(n_eff order by tree_id) as stage_n_eff
    from per_tree
    group by all
),

estimated as (
    select
        p.*,
        s.stage_n_eff,
        (p.n_eff + pr.rate * cfg.b) / (p.kept_edges + cfg.b) as rate,
        greatest(0.0, cfg.b * (p.n_eff + pr.rate * cfg.b) / (p.kept_edges + cfg.b) * (1 - p.n_eff / cfg.top_k))
            as expected_n_eff,
        case when p.band in ('never', 'always') then cfg.flagged_weight else 1.0 end as weight,
        (p.tokens + pr.tokens_per_edge * cfg.b) / (p.kept_edges + cfg.b) as tokens_per_edge,
        cfg.b as block_edges
    from per_tree as p
    inner join cfg on cfg.run_id = p.run_id
    inner join priors as pr on pr.run_id = p.run_id
    inner join stages as s on s.run_id = p.run_id and s.stage = p.stage
)

select
    run_id,
    tree_id,
    task,
    stage,
    eligible,
    kept_edges,
    granted_edges,
    tokens,
    n_eff,
    band,
    stage_n_eff,
    rate,
    expected_n_eff,
    weight,
    ln(1 + stage_n_eff + weight * expected_n_eff) - ln(1 + stage_n_eff) as value,
    block_edges * tokens_per_edge as expected_tokens,
    (ln(1 + stage_n_eff + weight * expected_n_eff) - ln(1 + stage_n_eff))
    / nullif(block_edges * tokens_per_edge, 0) * 1e6 as gain
from estimated
