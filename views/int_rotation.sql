-- Per tree: its place in the round-robin that hands out free Teacher slots, from now (ALGORITHM §2).
-- grain: run_id, tree_id
-- sources: stg_root_added, stg_edge_started
--
-- Trees take turns in tree-id order; visit 0 goes first. The round goes on after
-- the tree that started the last edge, or at that same tree when its start was a
-- root direction (a root's directions start in consecutive slots), so a resumed
-- run continues exactly where the killed one stopped.
with trees as (
    select
        run_id,
        tree_id,
        row_number() over (partition by run_id order by tree_id) - 1 as position,
        count(*) over (partition by run_id) as n
    from (select distinct run_id, tree_id from stg_root_added)
),

last_start as (
    select
        run_id,
        tree_id,
        parent_id = tree_id and attempt = 1 as is_fanout
    from stg_edge_started
    qualify row_number() over (partition by run_id order by seq desc) = 1
),

-- one row per run with trees (0 when the run started no edge yet)
origin as (
    select
        r.run_id,
        coalesce(max(t.position + case when l.is_fanout then 0 else 1 end), 0) as position
    from (select distinct run_id from trees) as r
    left join last_start as l on r.run_id = l.run_id
    left join trees as t on l.run_id = t.run_id and l.tree_id = t.tree_id
    group by r.run_id
)

select
    t.run_id,
    t.tree_id,
    ((t.position - o.position) % t.n + t.n) % t.n as visit
from trees as t
inner join origin as o on t.run_id = o.run_id
