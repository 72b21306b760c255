-- What a run cost: its tokens and the backend's cost over every task, one row a run.
-- grain: run_id
-- sources: run_config, cost_tasks
--
-- The one sum of a run's tokens and cost: cost_tasks' over the run's tasks (each
-- int_turns__costs' through cost_roots); null before a root was explored. The report's
-- and the collection page's run lines read it.
with sums as (
    select
        run_id,
        sum(tokens) as tokens,
        sum(cost) as cost
    from cost_tasks
    group by run_id
)

select
    r.run_id,
    s.tokens,
    s.cost
from run_config as r
left join sums as s on s.run_id = r.run_id
