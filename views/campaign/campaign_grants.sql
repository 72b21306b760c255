-- Every block the campaign granted: its round, task, run, tree, valid edges and the gain that chose it.
-- grain: round, task_run, tree_id
-- sources: stg_budget_allocated
--
-- gain is campaign_gains.gain when the block was chosen (null in the first pass,
-- which gives every root the same block).
with grants as (
    select
        seq,
        round,
        rule,
        unnest(cast(grants as json[])) as g
    from stg_budget_allocated
)

select
    seq,
    round,
    rule,
    g ->> 'task' as task,
    g ->> 'run' as task_run,
    g ->> 'tree_id' as tree_id,
    cast(g ->> 'edges' as bigint) as edges,
    cast(g ->> 'gain' as double) as gain
from grants
