-- Per weighting with a diversity lambda: the paths picked greedily by PathScore + lambda * the N_eff each adds (ALGORITHM §3, §5).
-- grain: run_id, selection_seq, tree_id, asof_seq, leaf_id
-- sources: int_paths__scored, int_nodes__created
--
-- Per root, up to top_k steps: among the ranked paths not picked yet, pick the one
-- with the highest path_score + diversity * (N_eff(picked + p) - N_eff(picked)),
-- compared to 12 decimals, ties to the smallest leaf id. N_eff of a set of paths:
-- the sum over its (path, edge) pairs of 1 / (m_e * L_p) (ALGORITHM §5). pick is the
-- step that picked the path, gain the N_eff it added. With diversity 0 the picks are
-- the plain Top-k by PathScore (a check of the greedy step).
with recursive candidates as (
    select
        run_id,
        selection_seq,
        tree_id,
        asof_seq,
        leaf_id,
        path_score,
        diversity,
        top_k,
        node_ids
    from int_paths__scored
    where ranked and diversity is not null
),

path_edges as (
    select
        c.run_id,
        c.selection_seq,
        c.tree_id,
        c.asof_seq,
        c.leaf_id,
        n.edge_id,
        len(c.node_ids) - 1 as path_length
    from (select *, unnest(node_ids[2:]) as node_id from candidates) as c
    inner join int_nodes__created as n on c.run_id = n.run_id and c.tree_id = n.tree_id and c.node_id = n.node_id
),

greedy (run_id, selection_seq, tree_id, asof_seq, pick, picked, leaf_id, n_eff, gain) as (
    select distinct
        run_id,
        selection_seq,
        tree_id,
        asof_seq,
        0,
        cast([] as varchar[]),
        cast(null as varchar),
        cast(0.0 as double),
        cast(0.0 as double)
    from candidates
    union all
    select run_id, selection_seq, tree_id, asof_seq, pick, picked, leaf_id, n_eff, gain
    from (
        select
            g.run_id,
            g.selection_seq,
            g.tree_id,
            g.asof_seq,
            g.pick + 1 as pick,
            list_append(g.picked, c.leaf_id) as picked,
            c.leaf_id,
            x.n_eff,
            x.n_eff - g.n_eff as gain,
            row_number() over (
                partition by g.run_id, g.selection_seq, g.tree_id, g.asof_seq
                order by round(c.path_score + c.diversity * (x.n_eff - g.n_eff), 12) desc, node_key(c.leaf_id)
            ) as choice
        from greedy as g
        inner join candidates as c
            on
                g.run_id = c.run_id
                and g.selection_seq = c.selection_seq
                and g.tree_id = c.tree_id
                and g.asof_seq = c.asof_seq
                and g.pick < c.top_k
                and not list_contains(g.picked, c.leaf_id)
        inner join lateral (
            select cast(sum(1.0 / (m * path_length) order by leaf_id, edge_id) as double) as n_eff
            from (
                select
                    e.leaf_id,
                    e.edge_id,
                    e.path_length,
                    count(*) over (partition by e.run_id, e.edge_id) as m
                from path_edges as e
                where
                    e.run_id = g.run_id
                    and e.selection_seq = g.selection_seq
                    and e.tree_id = g.tree_id
                    and e.asof_seq = g.asof_seq
                    and (list_contains(g.picked, e.leaf_id) or e.leaf_id = c.leaf_id)
            )
        ) as x on true
    )
    where choice = 1
)

select run_id, selection_seq, tree_id, asof_seq, leaf_id, pick, n_eff, gain
from greedy
where pick > 0
