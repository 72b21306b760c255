-- One row per edge attempt with the soft verifier and its parts (ALGORITHM §2).
-- grain: run_id, tree_id, edge_id
-- sources: int_edges__judged, int_nodes__lineage, run_config
-- materialized: table
--
-- improved = edge_score > ref(P) (strict, oriented; null without an edge score).
-- cleanliness = 1 at rate 0, else max(0.3, 0.8 - 0.5*rate/tool_error_prune).
-- A turn regresses when its score is null or below the score it started from:
-- turn 1 from P's last numeric turn score (start_o), turn 2 from turn 1 (or from
-- turn 1's start when s1 is null). A skipped turn 2 has no score: it regresses.
-- outcome, knowledge and soft are null when the edge has no score.
with edges as (
    select * from int_edges__judged
),

parents as (
    select * from int_nodes__lineage
),

measured as (
    select
        e.*,
        p.ref_o,
        p.start_o,
        case when e.edge_score_o is not null then e.edge_score_o > p.ref_o end as improved,
        (
            case when e.s1_o is null or e.s1_o < p.start_o then 1 else 0 end
            + case
                when e.s2_o is null or e.s2_o < coalesce(e.s1_o, p.start_o) then 1 else 0
            end
        ) / 2.0 as regressed_rate
    from edges as e
    left join parents as p on e.run_id = p.run_id and e.tree_id = p.tree_id and e.parent_id = p.node_id
),

final as (
    select
        m.*,
        case when m.improved then c.outcome_improved when not m.improved then c.outcome_not_improved
        end as outcome,
        case
            when m.tool_error_rate = 0 then c.cleanliness_clean
            else greatest(
                c.cleanliness_floor,
                c.cleanliness_start - c.cleanliness_slope * m.tool_error_rate / c.tool_error_prune
            )
        end as cleanliness,
        case
            when m.improved and m.has_knowledge then c.knowledge_improved_with
            when m.improved then c.knowledge_improved_without
            when not m.improved and m.has_knowledge then c.knowledge_not_improved_with
            when not m.improved then c.knowledge_not_improved_without
        end as knowledge,
        1.0 - m.regressed_rate as regression_stability
    from measured as m
    inner join run_config as c on m.run_id = c.run_id
)

select
    f.*,
    c.w_outcome * f.outcome
    + c.w_cleanliness * f.cleanliness
    + c.w_knowledge * f.knowledge
    + c.w_regression * f.regression_stability as soft
from final as f
inner join run_config as c on f.run_id = c.run_id
