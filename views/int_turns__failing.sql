-- The trailing run of turns that ended with a backend error (one row a run; streak 0 when the last turn did not).
-- grain: run_id
-- sources: run_config, stg_turn_finished
--
-- A backend error is a turn whose Teacher process failed (outcome 'error': the
-- endpoint unreachable, a bad model, a path OpenCode cannot use), not a turn whose
-- eval failed. turns counts the turns since the last turn without one, in log
-- order; streak counts them with the turns one lost Teacher process failed (the
-- same lost_server: an `opencode serve` killed under the turns it carried) as one,
-- so one crash counts once however many turns it carried (a log from before
-- lost_server counts every turn). The engine stops the run when streak reaches
-- backend_error_limit, and holds back publishing while it is above 0 (so a stopped
-- run's failed turns run again on --resume). last_error is the newest error message.
with last_good as (
    select
        c.run_id,
        coalesce(max(f.seq), 0) as seq
    from run_config as c
    left join stg_turn_finished as f on f.run_id = c.run_id and f.outcome <> 'error'
    group by c.run_id
)

select
    g.run_id,
    count(f.seq) - count(f.lost_server) + count(distinct f.lost_server) as streak,
    count(f.seq) as turns,
    arg_max(f.error, f.seq) as last_error
from last_good as g
left join stg_turn_finished as f on f.run_id = g.run_id and f.seq > g.seq and f.outcome = 'error'
group by g.run_id
