-- One row per tree, as of now: stop, edges by verdict, leaves by reason, best score (ALGORITHM §2).
-- grain: run_id, tree_id
-- sources: stg_root_added, int_trees__stopped, int_trees__asof, int_nodes__final, int_edges__started, run_config
--
-- The trees view without its path counts (run_progress reads this, every second
-- of a live run, without computing paths). stop_reason is the recorded
-- TreeStopped decision (replay checks it against the log); status is running,
-- stopping (a stop condition holds, edges are in flight) or done. kept_edges are
-- the edges that created a node (verdict kept or kept_exempt: the count the stop
-- rule compares with max_valid_edges), of them kept_exempt_edges by an exemption;
-- pruned_edges, retried_edges (verdict retry) and in_flight_edges count the other
-- attempts. final_leaves counts the leaves once the tree is done (stopped,
-- nothing in flight); *_leaves count the nodes by leaf reason, as of now.
with roots as (
    select *
    from stg_root_added
    qualify row_number() over (partition by run_id, tree_id order by seq) = 1
),

now_state as (
    select * from int_trees__asof where is_now
),

leaves as (
    select
        run_id,
        tree_id,
        count(*) filter (where leaf_reason is not null) as leaves,
        count(*) as nodes,
        count(*) filter (where leaf_reason = 'depth') as depth_leaves,
        count(*) filter (where leaf_reason = 'token') as token_leaves,
        count(*) filter (where leaf_reason = 'exhausted') as exhausted_leaves,
        count(*) filter (where leaf_reason = 'stopped') as stopped_leaves
    from int_nodes__final
    where is_now
    group by all
),

verdicts as (
    select
        run_id,
        tree_id,
        count(*) filter (where verdict = 'kept_exempt') as kept_exempt_edges,
        count(*) filter (where verdict = 'pruned') as pruned_edges,
        count(*) filter (where verdict = 'retry') as retried_edges,
        count(*) filter (where verdict is null) as in_flight_edges
    from int_edges__started
    group by all
)

select
    r.run_id,
    r.tree_id,
    r.task,
    r.snapshot,
    r.stage,
    r.score as root_score,
    s.stop_reason,
    n.kept_edges,
    n.good_leaves,
    case when n.is_done then l.leaves else 0 end as final_leaves,
    l.nodes,
    coalesce(v.kept_exempt_edges, 0) as kept_exempt_edges,
    coalesce(v.pruned_edges, 0) as pruned_edges,
    coalesce(v.retried_edges, 0) as retried_edges,
    coalesce(v.in_flight_edges, 0) as in_flight_edges,
    l.depth_leaves,
    l.token_leaves,
    l.exhausted_leaves,
    l.stopped_leaves,
    n.best_score_o * c.sign as best_score,
    case when n.is_done then 'done' when n.stop_reason is not null then 'stopping' else 'running' end
        as status,
    r.agent_id,
    r.global_index,
    r.selection_reason,
    s.stopped_seq
from roots as r
inner join run_config as c using (run_id)
left join int_trees__stopped as s using (run_id, tree_id)
left join now_state as n using (run_id, tree_id)
left join leaves as l using (run_id, tree_id)
left join verdicts as v using (run_id, tree_id)
