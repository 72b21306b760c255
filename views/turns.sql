-- One row per rollout turn, run or skipped (public, ALGORITHM §7).
-- grain: run_id, tree_id, edge_id, turn
-- sources: int_turns, int_edges__judged
--
-- A skipped turn 2 (turn 1 had no score and the edge could not be kept) has
-- skipped = true and nulls elsewhere.
with ran as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        session_id,
        score,
        eval_status,
        tool_calls,
        tool_errors,
        knowledge_actions,
        steps,
        context_tokens,
        outcome,
        false as skipped,
        finished_seq
    from int_turns
),

skipped as (
    select
        run_id,
        tree_id,
        edge_id,
        2 as turn,
        null as session_id,
        null as score,
        null as eval_status,
        null as tool_calls,
        null as tool_errors,
        null as knowledge_actions,
        null as steps,
        null as context_tokens,
        null as outcome,
        true as skipped,
        null as finished_seq
    from int_edges__judged
    where skip_turn2
)

select * from ran
union all by name
select * from skipped
