-- Per rule, every finished edge attempt with its value and label under that rule (ALGORITHM §3).
-- grain: run_id, selection_seq, tree_id, edge_id
-- sources: int_supervision_rules, int_edges__started, stg_root_added, int_turns, stg_conversation_recorded
--
-- An attempt is finished once it has a verdict (kept, kept_exempt, pruned or retry);
-- a rule sees the attempts finished at its watermark (an attempt's fields never change
-- once it has finished). value: under rule 'soft' the soft verifier, 0 for an attempt
-- without a score (its eval failed); under 'improved' 1 when it improved on its parent,
-- else 0. Values are rounded to 12 decimals, so equal values tie. label: value >=
-- threshold. node_id is the node the attempt started from (its parent); recorded: every
-- turn it ran recorded the conversation its model received (what an export renders).
with conversations as (
    select distinct run_id, tree_id, edge_id, turn
    from stg_conversation_recorded
),

turns as (
    select
        t.run_id,
        t.tree_id,
        t.edge_id,
        count(*) as turns,
        count(c.turn) as recorded_turns
    from int_turns as t
    left join conversations as c
        on t.run_id = c.run_id and t.tree_id = c.tree_id and t.edge_id = c.edge_id and t.turn = c.turn
    group by all
),

valued as (
    select
        r.run_id,
        r.selection_seq,
        e.tree_id,
        e.edge_id,
        e.parent_id as node_id,
        e.layer,
        e.slot,
        e.attempt,
        e.verdict,
        e.child_id,
        e.eval_ok,
        e.edge_score,
        e.improved,
        e.soft,
        e.tool_error_rate,
        e.completed_seq,
        root.task,
        root.stage,
        r.rule,
        round(
            case r.rule
                when 'soft' then coalesce(e.soft, 0.0)
                when 'improved' then case when e.improved then 1.0 else 0.0 end
            end,
            12
        ) as value,
        round(r.threshold, 12) as threshold,
        coalesce(t.turns, 0) as turns,
        coalesce(t.turns, 0) > 0 and t.recorded_turns = t.turns as recorded
    from int_supervision_rules as r
    inner join int_edges__started as e
        on
            e.run_id = r.run_id
            and e.verdict is not null
            and e.completed_seq <= coalesce(r.asof_seq, 9223372036854775807)
    inner join stg_root_added as root on e.run_id = root.run_id and e.tree_id = root.tree_id
    left join turns as t on e.run_id = t.run_id and e.tree_id = t.tree_id and e.edge_id = t.edge_id
)

select
    * exclude (threshold),
    value >= threshold as label
from valued
