-- Per run: where its samples came from, as an export's dataset card says it (engine/export/card.py).
-- grain: run_id
-- sources: run_config, stg_run_started, stg_run_resumed, int_run__finished, cost_roots
--
-- model: the Teacher's model (backend_options.model; null for the sim); tool_version: the
-- version of this project that started the run; teacher_versions: the Teacher runtime's
-- version at the start and at every resume, each once, sorted (empty in runs recorded
-- before it was); started_at: when it started; finished_at: when it last finished (null:
-- not finished, int_run__finished); tokens and cost: every turn's, every root's (cost_roots).
with versions as (
    select run_id, list(distinct teacher_version order by teacher_version) as teacher_versions
    from (
        select run_id, teacher_version from stg_run_started
        union all
        select run_id, teacher_version from stg_run_resumed
    )
    where teacher_version is not null
    group by all
),

started as (
    select run_id, min(recorded_at) as started_at
    from stg_run_started
    group by all
),

costs as (
    select
        run_id,
        count(*) as roots,
        sum(turns) as turns,
        sum(tokens) as tokens,
        sum(cost order by tree_id) as cost
    from cost_roots
    group by all
)

select
    c.run_id,
    c.task,
    c.direction,
    c.backend,
    json_extract_string(c.config_json, '$.backend_options.model') as model,
    c.tool_version,
    coalesce(v.teacher_versions, []) as teacher_versions,
    s.started_at,
    f.finished_at,
    coalesce(k.roots, 0) as roots,
    coalesce(k.turns, 0) as turns,
    coalesce(k.tokens, 0) as tokens,
    coalesce(k.cost, 0) as cost
from run_config as c
left join versions as v on c.run_id = v.run_id
left join started as s on c.run_id = s.run_id
left join int_run__finished as f on c.run_id = f.run_id
left join costs as k on c.run_id = k.run_id
