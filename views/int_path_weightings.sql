-- The PathScore weightings paths are scored with: the current one, and in replay each recorded selection's.
-- grain: run_id, selection_seq
-- sources: stg_paths_selected, run_config
--
-- selection_seq 0 is the current weighting, scored at the now points: the run
-- config's weights and top_k, or the variables path_w_max, path_w_avg,
-- path_w_clean, path_w_know, path_top_k and path_diversity where set (a
-- reselection, or a user's what-if). With `set variable asof_points = 'decisions'`
-- every recorded PathsSelected decision adds its own weights, k and diversity,
-- scored at its watermark. diversity (lambda) is null for the plain Top-k by
-- PathScore; set, the paths are picked greedily (int_paths__greedy).
with current_weights as (
    select
        run_id,
        0 as selection_seq,
        cast(null as bigint) as asof_seq,
        coalesce(getvariable('path_w_max'), w_path_max) as w_max,
        coalesce(getvariable('path_w_avg'), w_path_avg) as w_avg,
        coalesce(getvariable('path_w_clean'), w_path_clean) as w_clean,
        coalesce(getvariable('path_w_know'), w_path_know) as w_know,
        coalesce(getvariable('path_top_k'), top_k) as top_k,
        cast(getvariable('path_diversity') as double) as diversity
    from run_config
),

recorded as (
    select
        run_id,
        seq as selection_seq,
        watermark as asof_seq,
        cast(json_extract(weights, '$.max') as double) as w_max,
        cast(json_extract(weights, '$.avg') as double) as w_avg,
        cast(json_extract(weights, '$.clean') as double) as w_clean,
        cast(json_extract(weights, '$.know') as double) as w_know,
        top_k,
        cast(json_extract(weights, '$.diversity') as double) as diversity
    from stg_paths_selected
    where coalesce(getvariable('asof_points'), 'now') = 'decisions'
)

select * from current_weights
union all
select * from recorded
