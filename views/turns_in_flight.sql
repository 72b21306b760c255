-- One row per turn running now: its edge, and since when (the time its start was recorded).
-- grain: run_id, tree_id, edge_id
-- sources: int_edges__open, stg_edge_started, stg_turn_finished
--
-- Turn 1 of an open edge runs from the edge's start, turn 2 from turn 1's end (as the
-- engine recorded them: a watch's approximation, wall-clock, never for a decision).
-- A started edge whose turn the engine has not handed to the Teacher yet counts too.
select
    o.run_id,
    o.tree_id,
    o.edge_id,
    case o.next_step when 'turn_1' then 1 else 2 end as turn,
    case o.next_step when 'turn_1' then s.recorded_at else f.recorded_at end as since
from int_edges__open as o
inner join stg_edge_started as s on o.run_id = s.run_id and o.tree_id = s.tree_id and o.edge_id = s.edge_id
left join stg_turn_finished as f on o.run_id = f.run_id and o.tree_id = f.tree_id and o.edge_id = f.edge_id and f.turn = 1
where o.next_step in ('turn_1', 'turn_2')
