-- Each check of the grader before the first turn, with its outcome: passed, no score or score differs.
-- grain: run_id, seq
-- sources: stg_grader_checked, run_config
--
-- The grader graded a root's own code unchanged (GraderChecked); it passes when it
-- gave a number within the tolerance of the score the Student run recorded for the
-- root: |score - recorded| <= absolute + relative * |recorded|
-- (backend_options.grader_check_tolerance). problem says what failed, for the stop.
select
    g.run_id,
    g.seq,
    g.tree_id,
    g.commit_hash,
    g.score,
    g.recorded_score,
    g.eval_status,
    g.error,
    case
        when g.score is null or not isfinite(g.score) then 'no score'
        when abs(g.score - g.recorded_score)
            > c.grader_check_absolute + c.grader_check_relative * abs(g.recorded_score)
            then 'score differs'
        else 'passed'
    end as outcome,
    case
        when g.score is null or not isfinite(g.score)
            then 'the grader gave no score for the root ' || g.tree_id || ' ('
            || coalesce(g.eval_status, 'no status') || '): ' || coalesce(g.error, 'no message')
        when abs(g.score - g.recorded_score)
            > c.grader_check_absolute + c.grader_check_relative * abs(g.recorded_score)
            then 'the grader scored the root ' || g.tree_id || ' ' || g.score
            || ' where the Student run recorded ' || g.recorded_score || ' (tolerance '
            || c.grader_check_absolute || ' + ' || c.grader_check_relative || ' x |recorded|)'
    end as problem
from stg_grader_checked as g
inner join run_config as c on g.run_id = c.run_id
