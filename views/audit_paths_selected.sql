-- Recorded path selections that the log prefix they saw does not imply (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_paths_selected, int_paths__selected
--
-- Needs `set variable asof_points = 'decisions'` (replay sets it): each recorded
-- selection is scored with its own weights and k at its own watermark, and must
-- hold exactly the derived Top-k paths with the same rank and PathScore (within
-- 1e-9; equal values never differ, infinities included).
with recorded_lists as (
    select
        run_id,
        seq,
        from_json(
            paths,
            '[{"tree_id": "VARCHAR", "leaf_id": "VARCHAR", "rank": "BIGINT", "path_score": "DOUBLE"}]'
        ) as recorded_paths
    from stg_paths_selected
),

recorded as (
    -- unnest in the select list: a lateral unnest of from_json parsed the list per element
    select
        run_id,
        seq,
        unnest(recorded_paths, recursive := true)
    from recorded_lists
),

derived as (
    select
        run_id,
        selection_seq as seq,
        tree_id,
        leaf_id,
        rank,
        path_score
    from int_paths__selected
    where selection_seq > 0 and selected
),

compared as (
    select
        coalesce(r.run_id, d.run_id) as run_id,
        coalesce(r.seq, d.seq) as seq,
        coalesce(r.tree_id, d.tree_id) as tree_id,
        coalesce(r.tree_id, d.tree_id) || ':' || coalesce(r.leaf_id, d.leaf_id) as subject,
        case
            when d.leaf_id is null then 'not derived'
            when r.leaf_id is null then 'not recorded'
            when r.rank <> d.rank or differs_or_missing(r.path_score, d.path_score) then 'differs'
        end as problem,
        case when r.leaf_id is not null
            then format('rank={}, path_score={}', r.rank, r.path_score)
        end as recorded,
        case when d.leaf_id is not null
            then format('rank={}, path_score={}', d.rank, d.path_score)
        end as derived
    from recorded as r
    full outer join derived as d
        on r.run_id = d.run_id and r.seq = d.seq and r.tree_id = d.tree_id and r.leaf_id = d.leaf_id
)

select run_id, seq, 'paths_selected' as kind, tree_id, subject, problem, recorded, derived
from compared
where problem is not null
