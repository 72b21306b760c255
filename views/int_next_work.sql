-- Per tree and evaluation point: the edge starts due, in order (ALGORITHM §2).
-- grain: run_id, tree_id, asof_seq, pick
-- sources: int_trees__asof, int_nodes__asof, int_edges__started, int_edges__scored, int_nodes__created, run_config
--
-- Nothing once the tree's stop condition holds. Otherwise, in this order (pick 1
-- is the next start): the root's unstarted directions (kind fanout, by slot), the
-- retries owed to layer-1 attempts judged 'retry' (kind retry, oldest first), then
-- the active candidate with the highest Select, ties to the smallest node id (kind
-- select). A selected node's slot is one more than the edges it has started; the
-- edge id is <parent>/e<slot>-<attempt> (the macro edge_id).
-- Starting a direction or a retry changes only the root's edges, which decide none
-- of the later rows (the root is never a candidate, and a start never stops a
-- tree), so the engine starts them in order without asking again; it asks again
-- before recording a selection, whose watermark must show the starts before it.
-- In a run of a campaign's coverage policy a tree starts no more than its budget
-- room (int_trees__asof.budget_room): the picks past it are left out.
with trees as (
    select * from int_trees__asof
    where stop_reason is null
),

root_slots as (
    select
        t.run_id,
        t.tree_id,
        t.asof_seq,
        s.slot
    from trees as t
    inner join run_config as cfg on t.run_id = cfg.run_id
    cross join range(1, cfg.root_children + 1) as s (slot)
),

fanout as (
    select
        r.run_id,
        r.tree_id,
        r.asof_seq,
        'fanout' as kind,
        r.tree_id as parent_id,
        cast(r.slot as integer) as slot,
        1 as attempt,
        r.slot as priority
    from root_slots as r
    where not exists (
        select 1
        from int_edges__started as e
        where
            e.run_id = r.run_id
            and e.tree_id = r.tree_id
            and e.layer = 1
            and e.slot = r.slot
            and e.started_seq <= r.asof_seq
    )
),

retries as (
    select
        t.run_id,
        t.tree_id,
        t.asof_seq,
        'retry' as kind,
        e.parent_id,
        e.slot,
        e.attempt + 1 as attempt,
        1000000 + e.completed_seq as priority
    from trees as t
    inner join int_edges__scored as e
        on
            t.run_id = e.run_id
            and t.tree_id = e.tree_id
            and e.layer = 1
            and e.verdict = 'retry'
            and e.completed_seq <= t.asof_seq
    where not exists (
        select 1
        from int_edges__started as n
        where
            n.run_id = e.run_id
            and n.tree_id = e.tree_id
            and n.layer = 1
            and n.slot = e.slot
            and n.attempt = e.attempt + 1
            and n.started_seq <= t.asof_seq
    )
),

selected as (
    select
        n.run_id,
        n.tree_id,
        n.asof_seq,
        'select' as kind,
        n.node_id as parent_id,
        cast(n.started_edges + 1 as integer) as slot,
        1 as attempt,
        cast(9e18 as bigint) as priority,
        n.select_score,
        n.q,
        n.t
    from int_nodes__asof as n
    semi join trees as t using (run_id, tree_id, asof_seq)
    where n.is_active
    qualify
        row_number() over (
            partition by n.run_id, n.tree_id, n.asof_seq
            order by round(n.select_score, 12) desc, node_key(n.node_id)
        ) = 1
),

candidates as (
    select *, null as select_score, null as q, null as t from fanout
    union all by name
    select *, null as select_score, null as q, null as t from retries
    union all by name
    select * from selected
),

final as (
    select
        c.run_id,
        c.tree_id,
        c.asof_seq,
        c.kind,
        c.parent_id,
        c.slot,
        c.attempt,
        edge_id(c.parent_id, c.slot, c.attempt) as edge_id,
        c.select_score,
        c.q,
        c.t,
        p.state as parent_state,
        row_number() over (partition by c.run_id, c.tree_id, c.asof_seq order by c.priority) as pick,
        t.budget_room
    from candidates as c
    inner join trees as t using (run_id, tree_id, asof_seq)
    left join int_nodes__created as p on c.run_id = p.run_id and c.tree_id = p.tree_id and c.parent_id = p.node_id
)

select * exclude (budget_room) from final
where budget_room is null or pick <= budget_room
