-- Per tree and evaluation point: kept edges, good leaves, in-flight and pending work, stop (ALGORITHM §2).
-- grain: run_id, tree_id, asof_seq
-- sources: int_points, int_nodes__asof, int_edges__started, run_config, stg_block_granted, stg_grants_closed
-- materialized: table
--
-- Pending starts: root directions 1..root_children not started yet, and retries
-- owed to layer-1 attempts judged 'retry' (each is answered by one start of
-- attempt + 1). Stop (the first that holds): good leaves (depth/token/exhausted)
-- >= target -> good_leaves; kept edges > max_valid_edges -> max_edges; no active
-- candidate, nothing in flight, nothing pending -> exhausted. The condition is
-- monotone: once it holds at a point it holds at every later one.
-- A run of a campaign's coverage policy (run_config.granted) also has a budget:
-- granted_edges, the valid edges its BlockGranted facts gave the tree, and
-- budget_room = granted_edges - kept edges - edges in flight, the edges it may start
-- now (null in any other run: no bound). Once the campaign closed its grants
-- (GrantsClosed) a tree without room stops -> budget (checked after good_leaves and
-- max_edges, before exhausted); room is never given back, so this too is monotone.
with node_stats as (
    select
        run_id,
        tree_id,
        asof_seq,
        count(*) filter (where depth > 0) as kept_edges,
        count(*) filter (where open_leaf_reason is not null) as good_leaves,
        count(*) filter (where is_active) as active_candidates,
        max(score_o) as best_score_o
    from int_nodes__asof
    group by all
),

edge_stats as (
    select
        p.run_id,
        p.tree_id,
        p.asof_seq,
        count(*) filter (where e.completed_seq is null or e.completed_seq > p.asof_seq)
            as in_flight,
        count(distinct e.slot) filter (where e.layer = 1) as root_slots_started,
        count(*) filter (
            where e.layer = 1 and e.verdict = 'retry' and e.completed_seq <= p.asof_seq
        ) as retries_owed,
        count(*) filter (where e.layer = 1 and e.attempt >= 2) as retries_started
    from int_points as p
    inner join int_edges__started as e
        on p.run_id = e.run_id and p.tree_id = e.tree_id and e.started_seq <= p.asof_seq
    group by all
),

grants as (
    select
        p.run_id,
        p.tree_id,
        p.asof_seq,
        sum(g.edges) as granted_edges
    from int_points as p
    inner join stg_block_granted as g
        on p.run_id = g.run_id and p.tree_id = g.tree_id and g.seq <= p.asof_seq
    group by all
),

closed as (
    select run_id, min(seq) as closed_seq from stg_grants_closed group by run_id
),

counted as (
    select
        p.run_id,
        p.tree_id,
        p.asof_seq,
        p.is_now,
        coalesce(ns.kept_edges, 0) as kept_edges,
        coalesce(ns.good_leaves, 0) as good_leaves,
        coalesce(ns.active_candidates, 0) as active_candidates,
        ns.best_score_o,
        coalesce(es.in_flight, 0) as in_flight,
        greatest(0, cfg.root_children - coalesce(es.root_slots_started, 0)) as pending_fanout,
        coalesce(es.retries_owed, 0) - coalesce(es.retries_started, 0) as pending_retries,
        case
            when cfg.granted
                then coalesce(g.granted_edges, 0) - coalesce(ns.kept_edges, 0) - coalesce(es.in_flight, 0)
        end as budget_room,
        coalesce(g.granted_edges, 0) as granted_edges,
        coalesce(p.asof_seq >= c.closed_seq, false) as grants_closed,
        cfg.target_good_leaves,
        cfg.max_valid_edges
    from int_points as p
    inner join run_config as cfg using (run_id)
    left join closed as c using (run_id)
    left join node_stats as ns using (run_id, tree_id, asof_seq)
    left join edge_stats as es using (run_id, tree_id, asof_seq)
    left join grants as g using (run_id, tree_id, asof_seq)
),

stopped as (
    select
        * exclude (target_good_leaves, max_valid_edges),
        case
            when good_leaves >= target_good_leaves then 'good_leaves'
            when kept_edges > max_valid_edges then 'max_edges'
            when grants_closed and budget_room <= 0 then 'budget'
            when
                active_candidates = 0 and in_flight = 0 and pending_fanout = 0
                and pending_retries = 0
                then 'exhausted'
        end as stop_reason
    from counted
)

select
    *,
    stop_reason is not null and in_flight = 0 as is_done
from stopped
