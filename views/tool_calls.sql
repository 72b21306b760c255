-- One row per tool call, classified as a knowledge action or not (public, ALGORITHM §4, §7).
-- grain: seq
-- sources: stg_tool_called, run_config
--
-- A call is a knowledge action when its tool is in knowledge_tools (e.g. `skill`), a
-- file tool whose target matches knowledge_path_regex, or a shell tool whose command
-- matches knowledge_command_regex (coral notes/skills/log/show/kb) or touches a
-- shared path. `coral eval` matches neither. Patterns come from the run config.
with calls as (
    select * from stg_tool_called
),

final as (
    select
        calls.tree_id,
        calls.edge_id,
        calls.turn,
        calls.step,
        calls.call_id,
        calls.tool,
        calls.status,
        calls.target,
        calls.error,
        coalesce(
            case
                when list_contains(c.knowledge_tools, calls.tool) then true
                when list_contains(c.file_tools, calls.tool)
                    then regexp_matches(calls.target, getvariable('knowledge_path_regex'))
                when list_contains(c.shell_tools, calls.tool)
                    then regexp_matches(calls.target, getvariable('knowledge_command_regex'))
                    or regexp_matches(calls.target, getvariable('knowledge_path_regex'))
            end,
            false
        ) as is_knowledge,
        calls.seq
    from calls
    cross join run_config as c
)

select * from final
