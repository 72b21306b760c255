-- Where each finished turn's time went: start-up, the model, its tools (the eval among them), the rest (public).
-- grain: run_id, tree_id, edge_id, turn
-- sources: stg_turn_finished
--
-- As the backend measured them (TurnFinished; null where it cannot tell: the
-- simulated Teacher, a real one without --endpoint for start-up and model time, or a
-- turn recorded before phases were). startup_seconds runs from the turn's start to
-- its first request to the model (OpenCode's start, the fork of its session);
-- model_seconds is the time the model took to answer; tool_seconds the time some tool
-- call ran (eval_seconds, its eval commands, included); other_seconds what is left of
-- wall_seconds (the grader after the eval, the turn's end). node is where the turn
-- ran ('local' off a cluster). Wall-clock: for reports, never for a decision.
select
    run_id,
    tree_id,
    edge_id,
    turn,
    coalesce(json_extract_string(state, '$.node'), 'local') as node,
    outcome,
    wall_seconds,
    startup_seconds,
    model_seconds,
    tool_seconds,
    eval_seconds,
    case
        when startup_seconds is not null and model_seconds is not null
            then greatest(wall_seconds - startup_seconds - model_seconds - coalesce(tool_seconds, 0), 0)
    end as other_seconds
from stg_turn_finished
where wall_seconds is not null
