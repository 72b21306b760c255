-- Per tree: its place in the round-robin that hands out free Teacher slots, from now (ALGORITHM §2).
-- grain: tree_id
-- sources: stg_root_added, stg_edge_started
--
-- Trees take turns in tree-id order; visit 0 goes first. The round goes on after
-- the tree that started the last edge, or at that same tree when its start was a
-- root direction (a root's directions start in consecutive slots), so a resumed
-- run continues exactly where the killed one stopped.
with trees as (
    select
        tree_id,
        row_number() over (order by tree_id) - 1 as position,
        count(*) over () as n
    from (select distinct tree_id from stg_root_added)
),

last_start as (
    select
        tree_id,
        parent_id = tree_id and attempt = 1 as is_fanout
    from stg_edge_started
    order by seq desc
    limit 1
),

origin as (
    select coalesce(max(t.position + case when l.is_fanout then 0 else 1 end), 0) as position
    from last_start as l
    inner join trees as t on l.tree_id = t.tree_id
)

select
    t.tree_id,
    ((t.position - o.position) % t.n + t.n) % t.n as visit
from trees as t
cross join origin as o
