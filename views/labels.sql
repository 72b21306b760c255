-- One row per finished edge attempt with its value and label under the current rule (public, ALGORITHM §3, §7).
-- grain: run_id, tree_id, edge_id
-- sources: int_attempts__valued
--
-- Every finished attempt is labelled, pruned and retried ones and those whose eval
-- failed included: label = value >= threshold (see int_attempts__valued).
select * exclude (selection_seq)
from int_attempts__valued
where selection_seq = 0
