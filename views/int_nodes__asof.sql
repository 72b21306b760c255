-- Per evaluation point and node present then: children, failures, in-flight, leaf, ranks, Q, T, Select.
-- grain: run_id, tree_id, asof_seq, node_id
-- sources: int_points, int_nodes__scored, int_edges__started, run_config
-- materialized: table
--
-- The node attributes only its children's edges use (state, last_turn_score_o, ref_o,
-- start_o) are left out: nothing reads them per point, and every point would copy them.
-- A node is present at point w when created_seq <= w; an edge counts as started
-- when started_seq <= w and as finished when completed_seq <= w.
-- open_leaf_reason (the final 'stopped' is added by int_nodes__final): token
-- (tok >= limit, checked first), depth (depth >= max_depth), exhausted (non-root,
-- childless, failed >= max_failed_expansions).
-- Active candidate: non-root, not a leaf, depth < max_depth, tok < limit, children
-- below max_children, failed below max_failed_expansions, nothing in flight.
-- score_rank: mid-rank pct of score_o among present nodes with a score (0 if null);
-- best_rank: pct of path_best_o among present nodes; t: pct of -tok among the
-- active candidates; q = w1*score_rank + w2*best_rank + w3*process; select = q + alpha*t.
with present as (
    select
        n.run_id,
        p.asof_seq,
        p.is_now,
        p.for_paths,
        n.* exclude (run_id, state, last_turn_score_o, ref_o, start_o)
    from int_points as p
    inner join int_nodes__scored as n on p.run_id = n.run_id and p.tree_id = n.tree_id and n.created_seq <= p.asof_seq
),

edge_counts as (
    select
        p.run_id,
        p.tree_id,
        p.asof_seq,
        e.parent_id as node_id,
        count(*) as started_edges,
        count(*) filter (where e.verdict = 'pruned' and e.completed_seq <= p.asof_seq)
            as failed_expansions,
        count(*) filter (where e.completed_seq is null or e.completed_seq > p.asof_seq)
            as in_flight
    from int_points as p
    inner join int_edges__started as e on p.run_id = e.run_id and p.tree_id = e.tree_id and e.started_seq <= p.asof_seq
    group by all
),

child_counts as (
    select
        run_id,
        tree_id,
        asof_seq,
        parent_id as node_id,
        count(*) as valid_children
    from present
    where parent_id is not null
    group by all
),

stated as (
    select
        n.*,
        coalesce(c.valid_children, 0) as valid_children,
        coalesce(e.failed_expansions, 0) as failed_expansions,
        coalesce(e.in_flight, 0) as in_flight,
        coalesce(e.started_edges, 0) as started_edges,
        case
            when n.depth > 0 and n.tok >= cfg.hard_token_limit then 'token'
            when n.depth >= cfg.max_depth then 'depth'
            when
                n.depth > 0
                and coalesce(c.valid_children, 0) = 0
                and coalesce(e.failed_expansions, 0) >= cfg.max_failed_expansions
                then 'exhausted'
        end as open_leaf_reason,
        n.depth > 0
        and n.depth < cfg.max_depth
        and n.tok < cfg.hard_token_limit
        and coalesce(c.valid_children, 0) < cfg.max_children
        and coalesce(e.failed_expansions, 0) < cfg.max_failed_expansions
        and coalesce(e.in_flight, 0) = 0 as is_active,
        cfg.w_score_rank,
        cfg.w_best_rank,
        cfg.w_process,
        cfg.alpha
    from present as n
    inner join run_config as cfg using (run_id)
    left join child_counts as c using (run_id, tree_id, asof_seq, node_id)
    left join edge_counts as e using (run_id, tree_id, asof_seq, node_id)
),

counts as (
    -- The rank populations by pairing the nodes of each point (at most a few dozen):
    -- all present nodes (best_rank), those with a score (score_rank), the active
    -- candidates (t; a smaller -tok is a larger tok).
    select
        a.run_id,
        a.tree_id,
        a.asof_seq,
        a.node_id,
        count(*) filter (where b.score_o < a.score_o) as score_less,
        count(*) filter (where b.score_o = a.score_o) as score_equal,
        count(b.score_o) as score_total,
        count(*) filter (where b.path_best_o < a.path_best_o) as best_less,
        count(*) filter (where b.path_best_o = a.path_best_o) as best_equal,
        count(*) as best_total,
        count(*) filter (where b.is_active and b.tok > a.tok) as tok_less,
        count(*) filter (where b.is_active and b.tok = a.tok) as tok_equal,
        count(*) filter (where b.is_active) as tok_total
    from stated as a
    inner join stated as b using (run_id, tree_id, asof_seq)
    group by all
),

ranked as (
    select
        s.* exclude (w_score_rank, w_best_rank, w_process, alpha),
        case
            when s.score_o is null then 0.0
            else pct(c.score_less, c.score_equal, c.score_total)
        end as score_rank,
        pct(c.best_less, c.best_equal, c.best_total) as best_rank,
        case when s.is_active then pct(c.tok_less, c.tok_equal, c.tok_total) end as t,
        s.w_score_rank,
        s.w_best_rank,
        s.w_process,
        s.alpha
    from stated as s
    inner join counts as c using (run_id, tree_id, asof_seq, node_id)
),

scored as (
    select
        * exclude (w_score_rank, w_best_rank, w_process, alpha),
        w_score_rank * score_rank + w_best_rank * best_rank + w_process * process as q,
        alpha
    from ranked
)

select
    * exclude (alpha),
    q + alpha * t as select_score
from scored
