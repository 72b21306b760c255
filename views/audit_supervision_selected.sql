-- Recorded supervision selections that the log prefix they saw does not imply (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_supervision_selected, int_pairs__recorded, int_labels__recorded, int_steps__recorded, int_pairs, int_attempts__valued, int_step_paths
--
-- Needs `set variable asof_points = 'decisions'` (replay sets it): each recorded
-- selection is derived with its own rule, margin and threshold at its own watermark,
-- and must hold exactly the derived pairs (with their margins), labels (with their
-- values) and step paths (their edges and labels).
with recorded_pairs as (
    select p.*
    from int_pairs__recorded as p
    inner join stg_supervision_selected as s on p.run_id = s.run_id and p.selection_seq = s.seq
),

recorded_labels as (
    select l.*
    from int_labels__recorded as l
    inner join stg_supervision_selected as s on l.run_id = s.run_id and l.selection_seq = s.seq
),

recorded_steps as (
    select p.*
    from int_steps__recorded as p
    inner join stg_supervision_selected as s on p.run_id = s.run_id and p.selection_seq = s.seq
),

derived_pairs as (
    select * from int_pairs where selection_seq > 0
),

derived_labels as (
    select * from int_attempts__valued where selection_seq > 0
),

derived_steps as (
    select * from int_step_paths where selection_seq > 0
),

pairs as (
    select
        coalesce(r.run_id, d.run_id) as run_id,
        coalesce(r.selection_seq, d.selection_seq) as seq,
        coalesce(r.tree_id, d.tree_id) as tree_id,
        coalesce(r.chosen_id, d.chosen_id) || ' > ' || coalesce(r.rejected_id, d.rejected_id) as subject,
        case
            when d.chosen_id is null then 'not derived'
            when r.chosen_id is null then 'not recorded'
            when differs_or_missing(r.margin, d.margin) then 'differs'
        end as problem,
        case when r.chosen_id is not null then format('margin={}', r.margin) end as recorded,
        case when d.chosen_id is not null then format('margin={}', d.margin) end as derived
    from recorded_pairs as r
    full outer join derived_pairs as d
        on
            r.run_id = d.run_id
            and r.selection_seq = d.selection_seq
            and r.tree_id = d.tree_id
            and r.node_id = d.node_id
            and r.chosen_id = d.chosen_id
            and r.rejected_id = d.rejected_id
),

labels as (
    select
        coalesce(r.run_id, d.run_id) as run_id,
        coalesce(r.selection_seq, d.selection_seq) as seq,
        coalesce(r.tree_id, d.tree_id) as tree_id,
        coalesce(r.edge_id, d.edge_id) as subject,
        case
            when d.edge_id is null then 'not derived'
            when r.edge_id is null then 'not recorded'
            when r.label is distinct from d.label or differs_or_missing(r.value, d.value) then 'differs'
        end as problem,
        case when r.edge_id is not null then format('label={}, value={}', r.label, r.value) end as recorded,
        case when d.edge_id is not null then format('label={}, value={}', d.label, d.value) end as derived
    from recorded_labels as r
    full outer join derived_labels as d
        on
            r.run_id = d.run_id
            and r.selection_seq = d.selection_seq
            and r.tree_id = d.tree_id
            and r.edge_id = d.edge_id
),

steps as (
    select
        coalesce(r.run_id, d.run_id) as run_id,
        coalesce(r.selection_seq, d.selection_seq) as seq,
        coalesce(r.tree_id, d.tree_id) as tree_id,
        coalesce(r.tree_id, d.tree_id) || ':' || coalesce(r.leaf_id, d.leaf_id) as subject,
        case
            when d.leaf_id is null then 'not derived'
            when r.leaf_id is null then 'not recorded'
            when r.edge_ids is distinct from d.edge_ids or r.step_labels is distinct from d.step_labels then 'differs'
        end as problem,
        case when r.leaf_id is not null then format('edges={}, labels={}', r.edge_ids, r.step_labels) end as recorded,
        case when d.leaf_id is not null then format('edges={}, labels={}', d.edge_ids, d.step_labels) end as derived
    from recorded_steps as r
    full outer join derived_steps as d
        on
            r.run_id = d.run_id
            and r.selection_seq = d.selection_seq
            and r.tree_id = d.tree_id
            and r.leaf_id = d.leaf_id
)

select run_id, seq, 'supervision_selected' as kind, tree_id, subject, problem, recorded, derived
from (
    select * from pairs
    union all
    select * from labels
    union all
    select * from steps
)
where problem is not null
