-- Whether the run finished: its log holds a RunFinished (one row a run).
-- grain: run_id
-- sources: stg_run_finished, run_config
--
-- The one definition the progress views, the audits and the engine read. A run
-- stopped (RunStopped) or interrupted has not finished; its resume may finish it.
select
    cfg.run_id,
    exists (select 1 from stg_run_finished as f where f.run_id = cfg.run_id) as finished
from run_config as cfg
