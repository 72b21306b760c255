-- A campaign's line for a task's run: its selected paths, N_eff, roots, the stages it covers, and its spend.
-- grain: run_id, task
-- sources: coverage, campaign_spend
--
-- n, n_eff, n_eff_ratio and roots are the task stratum's of coverage (ALGORITHM §5);
-- stages_covered counts the stage strata with a selected path, of stages (the run's
-- stage strata); kept_edges and tokens are campaign_spend's.
select
    s.run_id,
    s.stratum_key as task,
    s.selected_paths as n,
    s.n_eff,
    s.n_eff_ratio,
    s.roots,
    (
        select count(*) from coverage as g
        where g.run_id = s.run_id and g.stratum = 'stage' and g.selected_paths > 0
    ) as stages_covered,
    (select count(*) from coverage as g where g.run_id = s.run_id and g.stratum = 'stage') as stages,
    p.kept_edges,
    p.tokens
from coverage as s
inner join campaign_spend as p on p.run_id = s.run_id
where s.stratum = 'task'
