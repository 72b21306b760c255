-- Per stratum of the run: roots, candidate, ranked and selected paths, edges by verdict, N_eff and quota fill (ALGORITHM §5).
-- grain: run_id, stratum, stratum_key
-- sources: coverage_strata, trees, paths, edges, int_paths__edges, snapshot_stages
--
-- Strata: those of coverage_strata (all, task, stage, depth, lineage, root). N = selected paths
-- (the Top-k under the current weighting); N_eff = sum over the stratum's selected
-- (path, edge) pairs of 1 / (m_e * L_p), m_e the stratum's selected paths through
-- edge e and L_p the path's length, recomputed inside the stratum; n_eff_ratio =
-- N_eff / N (null when N = 0). roots: the trees with a candidate path in the stratum
-- (for all, task, stage, lineage: every tree of the stratum). quota and quota_fill
-- (roots / quota) for the stage stratum of a run that selected its roots.
-- mean_path_score: the mean PathScore of the stratum's selected paths.
with tree_keys as (
    select
        run_id,
        tree_id,
        coalesce(task, 'none') as task,
        coalesce(stage, 'none') as stage,
        coalesce(task, 'none') || ' / ' || coalesce(agent_id, 'none') || ' / ' || coalesce(stage, 'none')
            as lineage
    from trees
),

tree_strata as (
    -- every stratum but depth is a set of trees (depth strata are of paths and edges)
    select
        k.run_id,
        s.stratum,
        case s.stratum
            when 'all' then 'all'
            when 'task' then k.task
            when 'stage' then k.stage
            when 'lineage' then k.lineage
            when 'root' then k.tree_id
            else error('views/coverage.sql: no key for the stratum ' || s.stratum)
        end as stratum_key,
        k.tree_id
    from coverage_strata as s
    cross join tree_keys as k
    where s.stratum <> 'depth'
),

path_strata as (
    select s.run_id, s.stratum, s.stratum_key, p.tree_id, p.leaf_id, p.ranked, p.selected, p.path_score
    from tree_strata as s
    inner join paths as p on s.run_id = p.run_id and s.tree_id = p.tree_id
    union all
    select run_id, 'depth', cast(depth as varchar), tree_id, leaf_id, ranked, selected, path_score
    from paths
),

edge_strata as (
    select s.run_id, s.stratum, s.stratum_key, e.verdict
    from tree_strata as s
    inner join edges as e on s.run_id = e.run_id and s.tree_id = e.tree_id
    union all
    select run_id, 'depth', cast(layer as varchar), verdict
    from edges
),

pairs as (
    select
        s.run_id,
        s.stratum,
        s.stratum_key,
        e.tree_id,
        e.leaf_id,
        e.edge_id,
        e.path_length
    from path_strata as s
    inner join int_paths__edges as e
        on s.run_id = e.run_id and s.tree_id = e.tree_id and s.leaf_id = e.leaf_id
    where s.selected
),

shares as (
    select
        run_id,
        stratum,
        stratum_key,
        tree_id,
        leaf_id,
        edge_id,
        1.0 / (count(*) over (partition by run_id, stratum, stratum_key, tree_id, edge_id) * path_length) as share
    from pairs
),

path_counts as (
    select
        run_id,
        stratum,
        stratum_key,
        count(distinct tree_id) as roots,
        count(*) as candidate_paths,
        count(*) filter (where ranked) as ranked_paths,
        count(*) filter (where selected) as selected_paths,
        avg(path_score order by tree_id, leaf_id) filter (where selected) as mean_path_score
    from path_strata
    group by all
),

edge_counts as (
    select
        run_id,
        stratum,
        stratum_key,
        count(*) filter (where verdict in ('kept', 'kept_exempt')) as kept_edges,
        count(*) filter (where verdict = 'kept_exempt') as kept_exempt_edges,
        count(*) filter (where verdict = 'pruned') as pruned_edges,
        count(*) filter (where verdict = 'retry') as retried_edges
    from edge_strata
    group by all
),

root_counts as (
    select run_id, stratum, stratum_key, count(*) as roots
    from tree_strata
    group by all
),

neff as (
    -- added in a fixed order, so that the same log always gives the same digits
    select run_id, stratum, stratum_key, sum(share order by tree_id, leaf_id, edge_id) as n_eff
    from shares
    group by all
),

keys as (
    select run_id, stratum, stratum_key from path_counts
    union
    select run_id, stratum, stratum_key from edge_counts
    union
    select run_id, stratum, stratum_key from root_counts
)

select
    k.run_id,
    k.stratum,
    k.stratum_key,
    coalesce(r.roots, p.roots, 0) as roots,
    coalesce(p.candidate_paths, 0) as candidate_paths,
    coalesce(p.ranked_paths, 0) as ranked_paths,
    coalesce(p.selected_paths, 0) as selected_paths,
    case when coalesce(p.selected_paths, 0) > 0 then coalesce(n.n_eff, 0.0) end as n_eff,
    case when coalesce(p.selected_paths, 0) > 0 then coalesce(n.n_eff, 0.0) / p.selected_paths end as n_eff_ratio,
    p.mean_path_score,
    coalesce(e.kept_edges, 0) as kept_edges,
    coalesce(e.kept_exempt_edges, 0) as kept_exempt_edges,
    coalesce(e.pruned_edges, 0) as pruned_edges,
    coalesce(e.retried_edges, 0) as retried_edges,
    q.quota,
    case when q.quota > 0 then coalesce(r.roots, 0) / q.quota end as quota_fill
from keys as k
left join root_counts as r on k.run_id = r.run_id and k.stratum = r.stratum and k.stratum_key = r.stratum_key
left join path_counts as p on k.run_id = p.run_id and k.stratum = p.stratum and k.stratum_key = p.stratum_key
left join edge_counts as e on k.run_id = e.run_id and k.stratum = e.stratum and k.stratum_key = e.stratum_key
left join neff as n on k.run_id = n.run_id and k.stratum = n.stratum and k.stratum_key = n.stratum_key
left join (select run_id, stage, sum(quota) as quota from snapshot_stages group by all) as q
    on k.run_id = q.run_id and k.stratum = 'stage' and k.stratum_key = q.stage
