-- Per task: what exploring its roots cost, and the tokens each selected path took to make.
-- grain: run_id, task
-- sources: cost_roots
select
    run_id,
    coalesce(task, 'none') as task,
    count(*) as roots,
    sum(turns) as turns,
    sum(steps) as steps,
    sum(tokens_input) as tokens_input,
    sum(tokens_cached) as tokens_cached,
    sum(tokens_output) as tokens_output,
    sum(tokens_reasoning) as tokens_reasoning,
    sum(tokens) as tokens,
    sum(cost order by tree_id) as cost,
    sum(wall_seconds order by tree_id) as wall_seconds,
    sum(selected_paths) as selected_paths,
    case when sum(selected_paths) > 0 then sum(tokens) / sum(selected_paths) end as tokens_per_selected_path
from cost_roots
group by all
