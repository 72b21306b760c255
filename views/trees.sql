-- One row per tree (root), as of now: stop reason, kept edges, leaves, best score (public, SPEC §7).
-- grain: tree_id
-- sources: stg_root_added, stg_tree_stopped, int_trees__asof, int_nodes__final, int_edges__started, run_config
--
-- stop_reason is the recorded TreeStopped decision (replay checks it against the
-- log); stop_condition is the condition that holds now. final_leaves counts the
-- leaves once the tree is done (stopped, nothing in flight). edges_* count the
-- edge attempts by verdict; *_leaves count the nodes by leaf reason, as of now.
with roots as (
    select *
    from stg_root_added
    qualify row_number() over (partition by tree_id order by seq) = 1
),

stops as (
    select
        tree_id,
        reason as stop_reason,
        seq as stopped_seq
    from stg_tree_stopped
    qualify row_number() over (partition by tree_id order by seq) = 1
),

now_state as (
    select * from int_trees__asof where is_now
),

leaves as (
    select
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
        tree_id,
        count(*) filter (where verdict = 'kept') as edges_kept,
        count(*) filter (where verdict = 'kept_exempt') as edges_kept_exempt,
        count(*) filter (where verdict = 'pruned') as edges_pruned,
        count(*) filter (where verdict = 'retry') as edges_retried
    from int_edges__started
    group by all
)

select
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
    coalesce(v.edges_kept, 0) as edges_kept,
    coalesce(v.edges_kept_exempt, 0) as edges_kept_exempt,
    coalesce(v.edges_pruned, 0) as edges_pruned,
    coalesce(v.edges_retried, 0) as edges_retried,
    l.depth_leaves,
    l.token_leaves,
    l.exhausted_leaves,
    l.stopped_leaves,
    n.in_flight,
    n.best_score_o * c.sign as best_score,
    n.stop_reason as stop_condition,
    case when n.is_done then 'done' when n.stop_reason is not null then 'stopping' else 'running' end
        as status,
    r.agent_id,
    r.global_index,
    r.selection_reason,
    s.stopped_seq
from roots as r
cross join run_config as c
left join stops as s using (tree_id)
left join now_state as n using (tree_id)
left join leaves as l using (tree_id)
left join verdicts as v using (tree_id)
