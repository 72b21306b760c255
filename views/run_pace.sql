-- The run's pace since its current session began: edges judged and tokens per hour, and an estimate of the time left.
-- grain: run_id
-- sources: stg_run_started, stg_run_resumed, int_run__finished, stg_edge_started, stg_edge_judged, int_turns__costs, int_trees__summarized, run_config
--
-- Wall-clock figures from the times events were recorded (for watching a run, never
-- for a decision). The session is the last start or resume: its rates leave out the
-- time a killed run lay still. The time left is the remaining work over the observed
-- throughput: the edge attempts the unfinished trees are expected to add, over the
-- session's edges judged per second (all trees together, however many run at once).
-- An unfinished tree is expected to grow as far as the finished trees that grew past
-- its attempts so far did, on average; when none did, by its share of the good leaves
-- it still needs (attempts x target_good_leaves / good_leaves); at least one attempt
-- more either way, so the estimate is never 0 while a tree is unfinished. eta_seconds
-- is null ("estimating") until a tree finished and an edge was judged in measured time
-- of the session; 0 once the run finished. started_at: the run's first start; run_seconds: from it to
-- its finish (the last RunFinished) or, while unfinished, to its last event (null: a time not recorded).
with first_start as (
    select run_id, min(recorded_at) as started_at
    from stg_run_started
    group by run_id
),

session as (
    select run_id, max(recorded_at) as started_at
    from (
        select run_id, recorded_at from stg_run_started
        union all
        select run_id, recorded_at from stg_run_resumed
    )
    group by run_id
),

latest as (
    select run_id, max(recorded_at) as last_event_at
    from (
        select run_id, recorded_at from stg_edge_started
        union all
        select run_id, recorded_at from stg_edge_judged
        union all
        select run_id, finished_at from int_turns__costs
    )
    group by run_id
),

judged as (
    select
        j.run_id,
        count(*) filter (where j.recorded_at >= s.started_at) as session_edges
    from stg_edge_judged as j
    inner join session as s using (run_id)
    group by j.run_id
),

tokens as (
    select
        c.run_id,
        sum(c.tokens) filter (where c.finished_at >= s.started_at) as session_tokens
    from int_turns__costs as c
    inner join session as s using (run_id)
    group by c.run_id
),

per_tree as (
    select
        t.run_id,
        t.tree_id,
        t.status,
        t.good_leaves,
        t.kept_edges + t.pruned_edges + t.retried_edges + t.in_flight_edges as attempts
    from int_trees__summarized as t
),

done as (
    select
        run_id,
        count(*) as trees_done,
        avg(attempts) as expected_edges_per_tree
    from per_tree
    where status = 'done'
    group by run_id
),

remaining as (
    select
        p.run_id,
        sum(greatest(
            coalesce(
                (
                    select avg(d.attempts) from per_tree as d
                    where d.run_id = p.run_id and d.status = 'done' and d.attempts > p.attempts
                ),
                p.attempts * c.target_good_leaves / greatest(p.good_leaves, 1)
            ) - p.attempts,
            1.0
        )) as remaining_edges
    from per_tree as p
    inner join run_config as c on p.run_id = c.run_id
    where p.status <> 'done'
    group by p.run_id
),

paced as (
    select
        s.run_id,
        b.started_at,
        date_diff('millisecond', b.started_at, coalesce(f.finished_at, l.last_event_at)) / 1000.0 as run_seconds,
        s.started_at as session_started_at,
        l.last_event_at,
        date_diff('millisecond', s.started_at, l.last_event_at) / 1000.0 as session_seconds,
        coalesce(j.session_edges, 0) as session_edges,
        coalesce(k.session_tokens, 0) as session_tokens,
        coalesce(e.trees_done, 0) as trees_done,
        e.expected_edges_per_tree,
        coalesce(r.remaining_edges, 0.0) as remaining_edges,
        f.finished
    from session as s
    inner join int_run__finished as f on s.run_id = f.run_id
    left join first_start as b on s.run_id = b.run_id
    left join latest as l on s.run_id = l.run_id
    left join judged as j on s.run_id = j.run_id
    left join tokens as k on s.run_id = k.run_id
    left join done as e on s.run_id = e.run_id
    left join remaining as r on s.run_id = r.run_id
)

select
    *,
    case when session_seconds > 0 then session_edges * 3600.0 / session_seconds end as edges_per_hour,
    case when session_seconds > 0 then session_tokens * 3600.0 / session_seconds end as tokens_per_hour,
    case
        when finished then 0.0
        when trees_done > 0 and session_edges > 0 and session_seconds > 0
            then remaining_edges * session_seconds / session_edges
    end as eta_seconds
from paced
