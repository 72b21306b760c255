-- The run's configuration as typed columns, read from its first RunStarted event.
-- grain: run_id
-- sources: stg_run_started
-- materialized: table
-- variables: knowledge_path_regex = path_regex, knowledge_command_regex = command_regex
--
-- Every parameter and weight of ALGORITHM §1-§4, one row a run; views join it on run_id.
-- eval_error_limit and the grader check's tolerance are null in runs recorded before
-- them (no such stop is then due); backend_error_scores is 'counted' in those (a backend
-- error's evals scored its edge then). granted: the run's trees grow only as far as a
-- campaign grants (config grants set; grant_block_edges and grant_flagged_weight are
-- its values, null otherwise). config_json is the config as recorded (what
-- engine.runs.recorded_config validates), tool_version the version that recorded it.
-- The two knowledge regexes are the defaults of the variables knowledge_path_regex
-- and knowledge_command_regex, which tool_calls reads (a regex must be a constant
-- for DuckDB to compile it once); set those variables to re-classify tool calls
-- with other patterns (ALGORITHM §4).
with first_start as (
    select *
    from stg_run_started
    qualify row_number() over (partition by run_id order by seq) = 1
),

final as (
    select
        run_id,
        command,
        task,
        direction,
        oriented(1.0, direction) as sign,
        cast(json_extract_string(config, '$.seed') as bigint) as seed,
        json_extract_string(config, '$.backend') as backend,
        cast(json_extract_string(config, '$.selection.num_roots') as bigint) as num_roots,
        cast(json_extract_string(config, '$.tree.root_children') as bigint) as root_children,
        cast(json_extract_string(config, '$.tree.max_children') as bigint) as max_children,
        cast(json_extract_string(config, '$.tree.max_depth') as bigint) as max_depth,
        cast(json_extract_string(config, '$.tree.hard_token_limit') as bigint) as hard_token_limit,
        cast(json_extract_string(config, '$.tree.target_good_leaves') as bigint)
            as target_good_leaves,
        cast(json_extract_string(config, '$.tree.max_valid_edges') as bigint) as max_valid_edges,
        cast(json_extract_string(config, '$.tree.max_failed_expansions') as bigint)
            as max_failed_expansions,
        cast(json_extract_string(config, '$.tree.tool_error_prune') as double) as tool_error_prune,
        cast(json_extract_string(config, '$.tree.alpha') as double) as alpha,
        cast(json_extract_string(config, '$.soft.outcome') as double) as w_outcome,
        cast(json_extract_string(config, '$.soft.cleanliness') as double) as w_cleanliness,
        cast(json_extract_string(config, '$.soft.knowledge') as double) as w_knowledge,
        cast(json_extract_string(config, '$.soft.regression') as double) as w_regression,
        cast(json_extract_string(config, '$.soft.outcome_improved') as double) as outcome_improved,
        cast(json_extract_string(config, '$.soft.outcome_not_improved') as double)
            as outcome_not_improved,
        cast(json_extract_string(config, '$.soft.cleanliness_clean') as double) as cleanliness_clean,
        cast(json_extract_string(config, '$.soft.cleanliness_start') as double) as cleanliness_start,
        cast(json_extract_string(config, '$.soft.cleanliness_slope') as double) as cleanliness_slope,
        cast(json_extract_string(config, '$.soft.cleanliness_floor') as double) as cleanliness_floor,
        cast(json_extract_string(config, '$.soft.knowledge_improved_with') as double)
            as knowledge_improved_with,
        cast(json_extract_string(config, '$.soft.knowledge_improved_without') as double)
            as knowledge_improved_without,
        cast(json_extract_string(config, '$.soft.knowledge_not_improved_with') as double)
            as knowledge_not_improved_with,
        cast(json_extract_string(config, '$.soft.knowledge_not_improved_without') as double)
            as knowledge_not_improved_without,
        cast(json_extract_string(config, '$.q.score_rank') as double) as w_score_rank,
        cast(json_extract_string(config, '$.q.best_rank') as double) as w_best_rank,
        cast(json_extract_string(config, '$.q.process') as double) as w_process,
        cast(json_extract_string(config, '$.paths.max') as double) as w_path_max,
        cast(json_extract_string(config, '$.paths.avg') as double) as w_path_avg,
        cast(json_extract_string(config, '$.paths.clean') as double) as w_path_clean,
        cast(json_extract_string(config, '$.paths.know') as double) as w_path_know,
        cast(json_extract_string(config, '$.paths.top_k') as bigint) as top_k,
        coalesce(json_extract_string(config, '$.supervision.rule'), 'soft') as supervision_rule,
        coalesce(cast(json_extract_string(config, '$.supervision.min_margin') as double), 0.1)
            as supervision_min_margin,
        coalesce(cast(json_extract_string(config, '$.supervision.threshold') as double), 0.7)
            as supervision_threshold,
        -- (a run recorded before the rule had it made such pairs)
        coalesce(json_extract_string(config, '$.supervision.against_verdict'), 'keep')
            as supervision_against_verdict,
        cast(json_extract(config, '$.knowledge.file_tools') as varchar[]) as file_tools,
        cast(json_extract(config, '$.knowledge.shell_tools') as varchar[]) as shell_tools,
        cast(json_extract(config, '$.knowledge.knowledge_tools') as varchar[]) as knowledge_tools,
        json_extract_string(config, '$.knowledge.path_regex') as path_regex,
        json_extract_string(config, '$.knowledge.command_regex') as command_regex,
        cast(json_extract_string(config, '$.eval_error_limit') as bigint) as eval_error_limit,
        coalesce(json_extract_string(config, '$.backend_error_scores'), 'counted') as backend_error_scores,
        cast(json_extract_string(config, '$.backend_options.grader_check_tolerance.relative') as double)
            as grader_check_relative,
        cast(json_extract_string(config, '$.backend_options.grader_check_tolerance.absolute') as double)
            as grader_check_absolute,
        cast(json_extract_string(config, '$.grants.block_edges') as bigint) as grant_block_edges,
        cast(json_extract_string(config, '$.grants.flagged_weight') as double) as grant_flagged_weight,
        coalesce(json_extract_string(config, '$.grants.block_edges') is not null, false) as granted,
        config as config_json,
        tool_version
    from first_start
)

select * from final
