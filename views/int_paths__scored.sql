-- Per weighting, candidate path and point: PathScore and its rank among the root's ranked paths (ALGORITHM §3).
-- grain: run_id, selection_seq, tree_id, asof_seq, leaf_id
-- sources: int_paths__measured, int_path_weightings
--
-- The current weighting (selection_seq 0) scores the paths of now; a recorded
-- selection's (replay) the paths of its watermark. path_score = max*max_score_rank
-- + avg*avg_score_rank + clean*avg_cleanliness + know*avg_knowledge; rank orders
-- the ranked paths of a root by path_score, compared to 12 decimals so that
-- floating-point noise ties (ties: smallest leaf id). Which paths are selected:
-- int_paths__selected.
with measured as (
    select * from int_paths__measured
),

weightings as (
    select * from int_path_weightings
),

paired as (
    select w.* exclude (asof_seq), m.* exclude (run_id)
    from measured as m
    inner join weightings as w
        on
            m.run_id = w.run_id
            and ((w.selection_seq = 0 and m.is_now) or (w.selection_seq > 0 and m.asof_seq = w.asof_seq))
),

weighted as (
    select
        * exclude (w_max, w_avg, w_clean, w_know),
        w_max * max_score_rank + w_avg * avg_score_rank
        + w_clean * avg_cleanliness + w_know * avg_knowledge as path_score
    from paired
),

ranked as (
    select
        *,
        case
            when ranked then row_number() over (
                partition by run_id, selection_seq, tree_id, asof_seq, ranked
                order by round(path_score, 12) desc, node_key(leaf_id)
            )
        end as rank
    from weighted
)

select * from ranked
