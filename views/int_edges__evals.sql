-- Per edge attempt with a finished turn: whether every eval of it failed with one error, and which.
-- grain: run_id, tree_id, edge_id
-- sources: stg_eval_finished
-- materialized: table
--
-- An eval failed when its status is crashed or timeout and it said why (EvalFinished
-- .error: an eval that fails without a message, like the sim's, shows no error to
-- compare). Errors compare by normalized_message (paths, hex ids, numbers and quoted
-- text left out: the same grader failing in another edge's checkout gives one key).
-- failed: every eval of the edge failed, all with one error_key; error is the newest
-- eval's message as recorded.
with evals as (
    select
        run_id,
        tree_id,
        edge_id,
        seq,
        error,
        eval_status in ('crashed', 'timeout') and error is not null as failed,
        normalized_message(error) as error_key
    from stg_eval_finished
)

select
    run_id,
    tree_id,
    edge_id,
    bool_and(failed) and count(distinct error_key) = 1 as failed,
    min(error_key) as error_key,
    arg_max(error, seq) as error
from evals
group by all
