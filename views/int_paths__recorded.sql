-- One row per path of every recorded selection: its nodes and the fields recorded with it (ALGORITHM §3).
-- grain: run_id, selection_id, tree_id, leaf_id
-- sources: stg_paths_selected
--
-- The paths a PathsSelected decision holds, as recorded (the training set of that
-- selection); a selection id recorded twice keeps its latest record (macro latest_record).
with recorded_lists as (
    select
        run_id,
        seq,
        selection_id,
        from_json(
            paths,
            '[{"tree_id": "VARCHAR", "leaf_id": "VARCHAR", "node_ids": "VARCHAR[]", "rank": "BIGINT",
               "path_score": "DOUBLE", "avg_cleanliness": "DOUBLE", "avg_knowledge": "DOUBLE",
               "avg_score": "DOUBLE", "avg_score_rank": "DOUBLE", "max_score": "DOUBLE",
               "max_score_rank": "DOUBLE", "task": "VARCHAR", "stage": "VARCHAR",
               "snapshot": "VARCHAR"}]'
        ) as recorded_paths
    from stg_paths_selected
    qualify latest_record(run_id, selection_id, seq)
),

recorded as (
    -- unnest in the select list: a lateral unnest of from_json parsed the list per element
    select
        run_id,
        seq as selection_seq,
        selection_id,
        unnest(recorded_paths, recursive := true)
    from recorded_lists
)

select * from recorded
