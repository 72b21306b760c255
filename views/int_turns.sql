-- One row per finished rollout turn: eval score, tool-call counts, steps, context tokens.
-- grain: run_id, tree_id, edge_id, turn
-- sources: stg_turn_finished, stg_eval_finished, stg_step_finished, tool_calls
-- materialized: table
--
-- A turn's facts are appended together, ending with TurnFinished, so every fact of
-- (edge, turn) belongs to that one finished turn. A non-finite score counts as null.
-- steps: the model calls the model answered, one StepFinished each (a call answered
-- while the turn was killed during its tools printed none: the backend records it
-- from the endpoint's usage). A request the model never answered is no step.
with calls as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        count(*) as tool_calls,
        count(*) filter (where status = 'error') as tool_errors,
        count(*) filter (where is_knowledge) as knowledge_actions
    from tool_calls
    group by all
),

steps as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        count(*) as steps
    from stg_step_finished
    group by all
)

select
    f.run_id,
    f.tree_id,
    f.edge_id,
    f.turn,
    f.seq as finished_seq,
    f.session_id,
    case when isfinite(e.score) then e.score end as score,
    e.eval_status,
    e.commit_hash,
    coalesce(c.tool_calls, 0) as tool_calls,
    coalesce(c.tool_errors, 0) as tool_errors,
    coalesce(c.knowledge_actions, 0) as knowledge_actions,
    coalesce(s.steps, 0) as steps,
    f.context_tokens,
    f.outcome,
    f.state
from stg_turn_finished as f
left join stg_eval_finished as e using (run_id, tree_id, edge_id, turn)
left join calls as c using (run_id, tree_id, edge_id, turn)
left join steps as s using (run_id, tree_id, edge_id, turn)
