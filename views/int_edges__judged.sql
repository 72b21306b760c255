-- One row per edge attempt: its two turns, raw metrics, verdict and child id (ALGORITHM §2).
-- grain: run_id, tree_id, edge_id
-- sources: int_turns, run_config
-- materialized: table
--
-- Edges with a finished turn (int_edges__started adds those in flight): parent,
-- slot and attempt come from the id <parent>/e<slot>-<attempt> (the macro
-- edge_parts; EdgeStarted enforces the format), so that an edge starting leaves
-- this table and those after it as they are. layer = depth(parent) + 1, the depth being the number of dots in the
-- parent id.
-- Turn 2 is skipped when turn 1 has no score and the edge cannot be kept anyway
-- (layer >= 3, or layer 1 attempt 1). An edge is complete when turn 2 finished or
-- was skipped; verdict and child id exist only then. hard_fail = not eval_ok or
-- tool_error_rate > tool_error_prune. Verdicts: layer 1 attempt 1 hard-failing ->
-- retry; hard-failing but exempt (layer 1 attempt >= 2, or layer 2) -> kept_exempt;
-- hard-failing at layer >= 3 -> pruned; otherwise kept. The k-th kept edge out of
-- P in completion order creates child P.k. Scores are raw; *_o are oriented. A turn
-- that ended with a backend error (outcome 'error') is no rollout result: its evals
-- score nothing (backend_error_scores 'ignored'; 'counted' in runs recorded before it).
with first_turns as (
    select
        run_id,
        tree_id,
        edge_id,
        edge_parts(edge_id) as id
    from int_turns
    where turn = 1
),

started as (
    select
        run_id,
        tree_id,
        edge_id,
        id.parent_id,
        id.slot,
        id.attempt
    from first_turns
),

counted as (
    select
        t.* replace (
            case when t.outcome = 'error' and c.backend_error_scores = 'ignored' then null else t.score end
                as score
        )
    from int_turns as t
    inner join run_config as c on t.run_id = c.run_id
),

joined as (
    select
        s.run_id,
        s.tree_id,
        s.edge_id,
        s.parent_id,
        s.slot,
        s.attempt,
        edge_layer(s.parent_id) as layer,
        t1.score as s1,
        t2.score as s2,
        t1.score * c.sign as s1_o,
        t2.score * c.sign as s2_o,
        t1.finished_seq as turn1_seq,
        t2.finished_seq as turn2_seq,
        coalesce(t1.tool_calls, 0) + coalesce(t2.tool_calls, 0) as tool_calls,
        coalesce(t1.tool_errors, 0) + coalesce(t2.tool_errors, 0) as tool_errors,
        coalesce(t1.knowledge_actions, 0) >= 1 and coalesce(t2.knowledge_actions, 0) >= 1
            as has_knowledge,
        coalesce(t1.steps, 0) + coalesce(t2.steps, 0) as steps,
        coalesce(t2.context_tokens, t1.context_tokens) as tok,
        coalesce(t2.state, t1.state) as end_state,
        t1.state as turn1_state,
        c.sign,
        c.tool_error_prune
    from started as s
    inner join run_config as c on s.run_id = c.run_id
    left join counted as t1 on s.run_id = t1.run_id and s.tree_id = t1.tree_id and s.edge_id = t1.edge_id and t1.turn = 1
    left join counted as t2 on s.run_id = t2.run_id and s.tree_id = t2.tree_id and s.edge_id = t2.edge_id and t2.turn = 2
),

flagged as (
    select
        * exclude (sign, tool_error_prune),
        (layer = 1 and attempt >= 2) or layer = 2 as is_exempt,
        s1 is not null and s2 is not null as eval_ok,
        greatest(s1_o, s2_o) as edge_score_o,
        greatest(s1_o, s2_o) * sign as edge_score,
        case when tool_calls = 0 then 0.0 else tool_errors / tool_calls end as tool_error_rate,
        tool_error_prune
    from joined
),

completed as (
    select
        * exclude (tool_error_prune),
        turn1_seq is not null and s1 is null and not is_exempt as skip_turn2,
        not eval_ok or tool_error_rate > tool_error_prune as hard_fail
    from flagged
),

judged as (
    select
        *,
        coalesce(turn2_seq, case when skip_turn2 then turn1_seq end) as completed_seq,
        case
            when turn2_seq is null and not skip_turn2 then null
            when layer = 1 and attempt = 1 and hard_fail then 'retry'
            when hard_fail and is_exempt then 'kept_exempt'
            when hard_fail then 'pruned'
            else 'kept'
        end as verdict
    from completed
)

select
    *,
    case
        when verdict in ('kept', 'kept_exempt')
            then parent_id || '.' || row_number() over (
                partition by run_id, tree_id, parent_id, verdict in ('kept', 'kept_exempt')
                order by completed_seq
            )
    end as child_id
from judged
