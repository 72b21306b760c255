-- Per recorded supervision selection, task and stage: its pairs, their fork points and N_eff, labels and step paths (ALGORITHM §5).
-- grain: run_id, selection_id, task, stage
-- sources: int_pairs__recorded, int_labels__recorded, int_steps__recorded
--
-- Pairs from one node share their prompt, and the rule orders that node's attempts
-- on one scale: a node whose pairs involve a attempts carries a - 1 independent
-- comparisons (the pairs between them form one connected graph, and any spanning
-- tree of it implies the rest). pair_n_eff sums that over the fork points (nodes
-- with a pair); pair_n_eff_ratio = pair_n_eff / pairs. The counts add up over
-- strata (a node belongs to one tree, so to one task and stage). against_verdict:
-- the pairs whose chosen attempt failed the tree's prune test and rejected passed it
-- (none under a rule that drops them).
with involved as (
    select run_id, selection_id, task, stage, tree_id, node_id, chosen_id as edge_id
    from int_pairs__recorded
    union
    select run_id, selection_id, task, stage, tree_id, node_id, rejected_id as edge_id
    from int_pairs__recorded
),

forks as (
    select
        run_id,
        selection_id,
        task,
        stage,
        count(*) as fork_points,
        sum(attempts - 1) as pair_n_eff
    from (
        select run_id, selection_id, task, stage, tree_id, node_id, count(*) as attempts
        from involved
        group by all
    )
    group by all
),

pair_counts as (
    select
        run_id,
        selection_id,
        task,
        stage,
        count(*) as pairs,
        count(*) filter (where against_verdict) as against_verdict
    from int_pairs__recorded
    group by all
),

label_counts as (
    select
        run_id,
        selection_id,
        task,
        stage,
        count(*) as labelled,
        count(*) filter (where label) as good,
        count(*) filter (where not label) as bad
    from int_labels__recorded
    group by all
),

step_counts as (
    select run_id, selection_id, task, stage, count(*) as step_paths, sum(len(edge_ids)) as steps
    from int_steps__recorded
    group by all
),

strata as (
    select run_id, selection_id, task, stage from label_counts
    union
    select run_id, selection_id, task, stage from pair_counts
    union
    select run_id, selection_id, task, stage from step_counts
)

select
    s.run_id,
    s.selection_id,
    s.task,
    s.stage,
    coalesce(p.pairs, 0) as pairs,
    coalesce(p.against_verdict, 0) as against_verdict,
    coalesce(f.fork_points, 0) as fork_points,
    coalesce(f.pair_n_eff, 0) as pair_n_eff,
    case when p.pairs > 0 then f.pair_n_eff / p.pairs end as pair_n_eff_ratio,
    coalesce(l.labelled, 0) as labelled,
    coalesce(l.good, 0) as good,
    coalesce(l.bad, 0) as bad,
    coalesce(st.step_paths, 0) as step_paths,
    coalesce(st.steps, 0) as steps
from strata as s
left join pair_counts as p
    on s.run_id = p.run_id and s.selection_id = p.selection_id and s.task is not distinct from p.task and s.stage is not distinct from p.stage
left join forks as f
    on s.run_id = f.run_id and s.selection_id = f.selection_id and s.task is not distinct from f.task and s.stage is not distinct from f.stage
left join label_counts as l
    on s.run_id = l.run_id and s.selection_id = l.selection_id and s.task is not distinct from l.task and s.stage is not distinct from l.stage
left join step_counts as st
    on s.run_id = st.run_id and s.selection_id = st.selection_id and s.task is not distinct from st.task
    and s.stage is not distinct from st.stage
