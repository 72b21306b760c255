-- The curve N_eff(N): N_eff of the first n selected paths, per root and pooled over the run (ALGORITHM §5).
-- grain: run_id, scope, tree_id, n
-- sources: paths, int_paths__edges
--
-- scope root: a tree's selected paths added in (-PathScore, leaf id) order; scope
-- pooled (tree_id '*'): the run's selected paths added in (-PathScore, task, tree,
-- leaf id) order. Paths of different trees share no edge, so the pooled curve is the
-- running sum of what each path added to its own tree's N_eff.
with selected as (
    select
        run_id,
        tree_id,
        leaf_id,
        task,
        path_score,
        row_number() over (
            partition by run_id, tree_id order by round(path_score, 12) desc, node_key(leaf_id)
        ) as tree_n,
        row_number() over (
            partition by run_id order by round(path_score, 12) desc, task, tree_id, node_key(leaf_id)
        ) as pooled_n
    from paths
    where selected
),

prefixes as (
    -- every (tree, n): the tree's first n selected paths
    select
        s.run_id,
        s.tree_id,
        n.tree_n as n,
        s.leaf_id
    from selected as s
    inner join selected as n on s.run_id = n.run_id and s.tree_id = n.tree_id and s.tree_n <= n.tree_n
),

pairs as (
    select
        p.run_id,
        p.tree_id,
        p.n,
        p.leaf_id,
        e.edge_id,
        e.path_length
    from prefixes as p
    inner join int_paths__edges as e on p.run_id = e.run_id and p.tree_id = e.tree_id and p.leaf_id = e.leaf_id
),

root_curve as (
    select
        run_id,
        tree_id,
        n,
        sum(share order by leaf_id, edge_id) as n_eff
    from (
        select
            *,
            1.0 / (count(*) over (partition by run_id, tree_id, n, edge_id) * path_length) as share
        from pairs
    )
    group by all
),

added as (
    select
        s.run_id,
        s.pooled_n,
        c.n_eff - coalesce(b.n_eff, 0.0) as gain
    from selected as s
    inner join root_curve as c on s.run_id = c.run_id and s.tree_id = c.tree_id and s.tree_n = c.n
    left join root_curve as b on s.run_id = b.run_id and s.tree_id = b.tree_id and s.tree_n - 1 = b.n
)

select run_id, 'root' as scope, tree_id, n, n_eff from root_curve
union all
select
    run_id,
    'pooled' as scope,
    '*' as tree_id,
    pooled_n as n,
    sum(gain) over (partition by run_id order by pooled_n rows between unbounded preceding and current row) as n_eff
from added
