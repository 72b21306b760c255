-- Per judged edge, in verdict order: the streak of edges whose evals all failed with one error that it ends.
-- grain: run_id, edge_id
-- sources: stg_edge_judged, int_edges__evals, stg_run_stopped
--
-- streak is the number of edges up to this one, in verdict order, each of which
-- failed (int_edges__evals: every eval crashed or timed out) with this one's error,
-- with no RunStopped between them (a stop ends a streak, so a resumed run counts
-- afresh); 0 when this edge did not fail so. The engine stops the run when the last
-- edge's streak reaches eval_error_limit (int_run__stopping), with stop_error as the
-- stop's message.
with timeline as (
    select
        j.run_id,
        j.seq,
        j.tree_id,
        j.edge_id,
        e.failed,
        e.error_key,
        e.error,
        false as is_stop
    from stg_edge_judged as j
    inner join int_edges__evals as e using (run_id, tree_id, edge_id)
    union all
    select
        run_id,
        seq,
        null as tree_id,
        null as edge_id,
        null as failed,
        null as error_key,
        null as error,
        true as is_stop
    from stg_run_stopped
),

eras as (
    select
        *,
        sum(case when is_stop then 1 else 0 end) over (partition by run_id order by seq) as era
    from timeline
),

starts as (
    select
        *,
        case
            when failed and lag(failed) over w and lag(error_key) over w = error_key and lag(era) over w = era
                then 0
            else 1
        end as starts_island
    from eras
    where not is_stop
    window w as (partition by run_id order by seq)
),

islands as (
    select
        *,
        sum(starts_island) over (partition by run_id order by seq) as island
    from starts
),

streaks as (
    select
        run_id,
        seq as judged_seq,
        tree_id,
        edge_id,
        failed,
        error_key,
        error,
        case when failed then row_number() over (partition by run_id, island order by seq) else 0 end as streak
    from islands
)

select
    *,
    'the evals of the last ' || streak || ' edges all failed with the same error: ' || error as stop_error
from streaks
