-- Whether the run finished: its log holds a RunFinished (one row).
-- grain: run_key
-- sources: stg_run_finished
--
-- The one definition the progress views, the audits and the engine read. A run
-- stopped (RunStopped) or interrupted has not finished; its resume may finish it.
select
    1 as run_key,
    exists (select 1 from stg_run_finished) as finished
