-- One row per preference pair under the current rule: chosen and rejected attempts from one node (public, ALGORITHM §3, §7).
-- grain: run_id, tree_id, node_id, chosen_id, rejected_id
-- sources: int_pairs
--
-- The rule is the run config's [supervision] (or the supervision_* variables): see
-- int_attempts__valued and int_pairs. chosen_id and rejected_id are edge attempt ids;
-- margin = chosen_value - rejected_value >= min_margin. recorded: both attempts'
-- turns recorded their conversations (an export can render the pair).
select * exclude (selection_seq)
from int_pairs
where selection_seq = 0
