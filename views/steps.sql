-- One row per root-to-leaf path of kept edges with each edge's label under the current rule (public, ALGORITHM §3, §7).
-- grain: run_id, tree_id, leaf_id
-- sources: int_step_paths
--
-- edge_ids, step_values and step_labels are root to leaf (see int_step_paths): the
-- stepwise supervision of a process reward model.
select * exclude (selection_seq)
from int_step_paths
where selection_seq = 0
