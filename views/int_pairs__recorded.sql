-- One row per pair of every recorded supervision selection, as recorded (ALGORITHM §3).
-- grain: run_id, selection_id, tree_id, node_id, chosen_id, rejected_id
-- sources: stg_supervision_selected, int_edges__started
--
-- A selection id recorded twice keeps its latest record (macro latest_record). against_verdict: the chosen
-- attempt failed the tree's prune test and the rejected one passed it (the macro
-- against_verdict over the attempts' verdicts, which never change once recorded).
with lists as (
    select
        run_id,
        seq,
        selection_id,
        from_json(
            pairs,
            '[{"tree_id": "VARCHAR", "node_id": "VARCHAR", "depth": "BIGINT", "chosen_id": "VARCHAR", "rejected_id": "VARCHAR",
               "margin": "DOUBLE", "task": "VARCHAR", "stage": "VARCHAR"}]'
        ) as recorded
    from stg_supervision_selected
    qualify latest_record(run_id, selection_id, seq)
),

pairs as (
    select
        run_id,
        seq as selection_seq,
        selection_id,
        unnest(recorded, recursive := true)
    from lists
)

select
    p.*,
    against_verdict(c.verdict, r.verdict) as against_verdict
from pairs as p
left join int_edges__started as c on p.run_id = c.run_id and p.tree_id = c.tree_id and p.chosen_id = c.edge_id
left join int_edges__started as r on p.run_id = r.run_id and p.tree_id = r.tree_id and p.rejected_id = r.edge_id
