-- The rules attempts are valued by: the current one, and in replay each recorded supervision selection's.
-- grain: run_id, selection_seq
-- sources: stg_supervision_selected, run_config
--
-- selection_seq 0 is the current rule, over the whole prefix (asof_seq null): the run
-- config's [supervision] rule, min_margin, threshold and against_verdict, or the
-- variables supervision_rule, supervision_min_margin, supervision_threshold and
-- supervision_against_verdict where set (a reselection, or a user's what-if). With `set variable asof_points = 'decisions'`
-- every recorded SupervisionSelected decision adds its own rule at its watermark.
with current_rule as (
    select
        run_id,
        0 as selection_seq,
        cast(null as bigint) as asof_seq,
        coalesce(getvariable('supervision_rule'), supervision_rule) as rule,
        coalesce(getvariable('supervision_min_margin'), supervision_min_margin) as min_margin,
        coalesce(getvariable('supervision_threshold'), supervision_threshold) as threshold,
        coalesce(getvariable('supervision_against_verdict'), supervision_against_verdict) as against_verdict
    from run_config
),

recorded as (
    select
        run_id,
        seq as selection_seq,
        watermark as asof_seq,
        rule,
        min_margin,
        threshold,
        against_verdict
    from stg_supervision_selected
    where coalesce(getvariable('asof_points'), 'now') = 'decisions'
)

select * from current_rule
union all
select * from recorded
