-- One row per step path of every recorded supervision selection, as recorded (ALGORITHM §3).
-- grain: run_id, selection_id, tree_id, leaf_id
-- sources: stg_supervision_selected
--
-- A selection id recorded twice keeps its latest record (macro latest_record).
with lists as (
    select
        run_id,
        seq,
        selection_id,
        from_json(
            step_paths,
            '[{"tree_id": "VARCHAR", "leaf_id": "VARCHAR", "edge_ids": "VARCHAR[]", "step_values": "DOUBLE[]",
               "step_labels": "BOOLEAN[]", "task": "VARCHAR", "stage": "VARCHAR"}]'
        ) as recorded
    from stg_supervision_selected
    qualify latest_record(run_id, selection_id, seq)
),

items as (
    select
        run_id,
        seq,
        selection_id,
        unnest(recorded) as item
    from lists
)

select
    run_id,
    seq as selection_seq,
    selection_id,
    item.tree_id,
    item.leaf_id,
    item.edge_ids,
    item.step_values,
    item.step_labels,
    item.task,
    item.stage
from items
