-- The selected paths: the Top-k per root by PathScore (public, ALGORITHM §3, §7).
-- grain: run_id, tree_id, leaf_id
-- sources: paths
--
-- The default Top-6 under the run config's weights; under the path_* variables
-- when they are set (what `reselect` does).
select *
from paths
where selected
