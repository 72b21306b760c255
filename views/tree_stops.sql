-- How many of a run's trees stopped for each reason, one row a reason met.
-- grain: run_id, stop_reason
-- sources: int_trees__summarized
--
-- The one count of stop reasons (int_trees__summarized.stop_reason: the recorded
-- TreeStopped's); a tree not stopped yet is not counted. watch's frame and the run
-- page read it.
select
    run_id,
    stop_reason,
    count(*) as trees
from int_trees__summarized
where stop_reason is not null
group by run_id, stop_reason
