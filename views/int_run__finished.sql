-- Whether the run finished: its log holds a RunFinished (one row a run).
-- grain: run_id
-- sources: stg_run_finished, run_config
--
-- The one definition the progress views, the audits and the engine read. A run
-- stopped (RunStopped) or interrupted has not finished; its resume may finish it.
-- finished_at: when its last RunFinished was recorded (null: not finished).
select
    cfg.run_id,
    f.run_id is not null as finished,
    f.finished_at
from run_config as cfg
left join (
    select run_id, arg_max(recorded_at, seq) as finished_at
    from stg_run_finished
    group by all
) as f on cfg.run_id = f.run_id
