-- One row per started edge attempt, in flight or finished, with its metrics once it has any (ALGORITHM §2).
-- grain: run_id, tree_id, edge_id
-- sources: stg_edge_started, int_edges__scored
--
-- The as-of views count started and in-flight edges from here. int_edges__judged
-- and int_edges__scored hold only edges with a finished turn, so an edge starting
-- makes only the as-of tables stale; the metric columns are null until turn 1
-- finishes. parent_id, slot and attempt are the EdgeStarted fact's.
select
    s.run_id,
    s.tree_id,
    s.edge_id,
    s.parent_id,
    s.slot,
    s.attempt,
    edge_layer(s.parent_id) as layer,
    s.seq as started_seq,
    e.* exclude (run_id, tree_id, edge_id, parent_id, slot, attempt, layer)
from stg_edge_started as s
left join int_edges__scored as e on s.run_id = e.run_id and s.tree_id = e.tree_id and s.edge_id = e.edge_id
