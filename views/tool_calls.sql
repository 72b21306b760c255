-- One row per tool call, classified as a knowledge action or not, with its area and access (public, ALGORITHM §4, §7).
-- grain: run_id, seq
-- sources: stg_tool_called, run_config
--
-- A call is a knowledge action when its tool is in knowledge_tools (e.g. `skill`), a
-- file tool whose target matches knowledge_path_regex, or a shell tool whose command
-- matches knowledge_command_regex (coral notes/skills/log/show/kb) or touches a
-- shared path. `coral eval` matches neither. Patterns come from the run config.
-- knowledge_area (knowledge actions only): coral_cli for a coral knowledge command,
-- skills for the skill tool, else the shared area its target names (notes, skills,
-- attempts, roles, logs). knowledge_access: write for the file tools write, edit,
-- multiedit and patch, and for shell commands that redirect (>) or run tee, cp, mv,
-- rm, mkdir or touch on a shared path; read otherwise.
with calls as (
    select * from stg_tool_called
),

classified as (
    select
        calls.run_id,
        calls.tree_id,
        calls.edge_id,
        calls.turn,
        calls.step,
        calls.call_id,
        calls.tool,
        calls.status,
        calls.target,
        calls.error,
        list_contains(c.file_tools, calls.tool) as is_file_tool,
        list_contains(c.shell_tools, calls.tool) as is_shell_tool,
        list_contains(c.knowledge_tools, calls.tool) as is_knowledge_tool,
        coalesce(regexp_matches(calls.target, getvariable('knowledge_path_regex')), false) as touches_shared,
        coalesce(regexp_matches(calls.target, getvariable('knowledge_command_regex')), false) as runs_coral,
        calls.seq
    from calls
    inner join run_config as c on c.run_id = calls.run_id
),

final as (
    select
        run_id,
        tree_id,
        edge_id,
        turn,
        step,
        call_id,
        tool,
        status,
        target,
        error,
        is_knowledge_tool
        or (is_file_tool and touches_shared)
        or (is_shell_tool and (runs_coral or touches_shared)) as is_knowledge,
        seq,
        is_file_tool,
        is_shell_tool,
        is_knowledge_tool,
        touches_shared,
        runs_coral
    from classified
)

select
    * exclude (is_file_tool, is_shell_tool, is_knowledge_tool, touches_shared, runs_coral),
    case
        when not is_knowledge then null
        when is_knowledge_tool then 'skills'
        when is_shell_tool and runs_coral then 'coral_cli'
        else coalesce(
            regexp_extract(target, '/(notes|skills|attempts|roles|logs)(/|$|[\s"''])', 1), 'other'
        )
    end as knowledge_area,
    case
        when not is_knowledge then null
        when is_file_tool and tool in ('write', 'edit', 'multiedit', 'patch') then 'write'
        when is_shell_tool and touches_shared
            and regexp_matches(target, '(>|\btee\b|\bcp\b|\bmv\b|\brm\b|\bmkdir\b|\btouch\b)') then 'write'
        else 'read'
    end as knowledge_access
from final
