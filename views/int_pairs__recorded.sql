-- One row per pair of every recorded supervision selection, as recorded (ALGORITHM §3).
-- grain: run_id, selection_id, tree_id, node_id, chosen_id, rejected_id
-- sources: stg_supervision_selected
--
-- A selection id recorded twice keeps its latest record.
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
    qualify row_number() over (partition by run_id, selection_id order by seq desc) = 1
)

select
    run_id,
    seq as selection_seq,
    selection_id,
    unnest(recorded, recursive := true)
from lists
