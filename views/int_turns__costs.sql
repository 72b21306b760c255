-- Per finished turn: its tokens by kind and in all, model calls, the backend's cost, wall time and phases.
-- grain: run_id, tree_id, edge_id, turn
-- sources: stg_turn_finished, stg_step_finished
--
-- Tokens are summed over the turn's steps as the backend reported them (OpenCode:
-- input excludes the cached part, output excludes reasoning); tokens is the four
-- kinds' total, the one definition every view that counts tokens reads. wall_seconds is
-- wall-clock time (null: the backend did not measure it, never 0), as are its phases (turn_phases: null where the backend could not
-- tell) and finished_at (when the turn was recorded): for reports only, never for a
-- decision.
with steps as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        count(*) as steps,
        sum(tokens_input) as tokens_input,
        sum(tokens_cache_read) as tokens_cached,
        sum(tokens_output) as tokens_output,
        sum(tokens_reasoning) as tokens_reasoning,
        sum(cost order by step) as cost
    from stg_step_finished
    group by all
)

select
    f.run_id,
    f.tree_id,
    f.edge_id,
    f.turn,
    coalesce(s.steps, 0) as steps,
    coalesce(s.tokens_input, 0) as tokens_input,
    coalesce(s.tokens_cached, 0) as tokens_cached,
    coalesce(s.tokens_output, 0) as tokens_output,
    coalesce(s.tokens_reasoning, 0) as tokens_reasoning,
    coalesce(s.tokens_input, 0) + coalesce(s.tokens_cached, 0) + coalesce(s.tokens_output, 0)
        + coalesce(s.tokens_reasoning, 0) as tokens,
    coalesce(s.cost, 0.0) as cost,
    f.wall_seconds,
    f.startup_seconds,
    f.model_seconds,
    f.tool_seconds,
    f.recorded_at as finished_at,
    f.seq as finished_seq
from stg_turn_finished as f
left join steps as s using (run_id, tree_id, edge_id, turn)
