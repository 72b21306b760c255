-- The strata coverage counts by (ALGORITHM §5), in the order audit lists them.
-- grain: stratum
-- sources:
--
-- all: the run; task; stage (of the root); depth (of the path's leaf, and the edges at
-- that layer); lineage (task / Student agent / stage of the root); root (one tree).
-- audit --by takes these names (all is always listed).
select stratum, stratum_order
from (
    values ('all', 1), ('task', 2), ('stage', 3), ('depth', 4), ('lineage', 5), ('root', 6)
) as s (stratum, stratum_order)
