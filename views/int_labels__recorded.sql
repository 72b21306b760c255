-- One row per labelled attempt of every recorded supervision selection, as recorded (ALGORITHM §3).
-- grain: run_id, selection_id, tree_id, edge_id
-- sources: stg_supervision_selected
--
-- A selection id recorded twice keeps its latest record (macro latest_record).
with lists as (
    select
        run_id,
        seq,
        selection_id,
        from_json(
            labels,
            '[{"tree_id": "VARCHAR", "edge_id": "VARCHAR", "node_id": "VARCHAR", "layer": "BIGINT", "value": "DOUBLE",
               "label": "BOOLEAN", "task": "VARCHAR", "stage": "VARCHAR"}]'
        ) as recorded
    from stg_supervision_selected
    qualify latest_record(run_id, selection_id, seq)
)

select
    run_id,
    seq as selection_seq,
    selection_id,
    unnest(recorded, recursive := true)
from lists
