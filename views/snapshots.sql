-- Every snapshot folder seen, with its stage, pick and reason (public, ALGORITHM §7).
-- grain: run_id, task, snapshot
-- sources: stg_snapshot_seen, int_snapshots__staged, int_snapshots__picked
--
-- score is raw; score_for_stage, smooth and gain are oriented. gain is null in
-- the position fallback and for skipped folders; skip_reason is null for candidates.
-- For an attempt of a CORAL run, path is its attempt file and shared_state_hash the
-- checkpoint its shared dir comes from.
with seen as (
    select * from stg_snapshot_seen
),

staged as (
    select * from int_snapshots__staged
    where is_now
),

picked as (
    select p.*
    from int_snapshots__picked as p
    semi join staged as s using (run_id, task, asof_seq)
),

final as (
    select
        seen.run_id,
        seen.task,
        seen.snapshot,
        seen.global_index,
        seen.agent_id,
        seen.commit_hash,
        seen.eval_ok,
        seen.score,
        staged.score_for_stage,
        staged.smooth,
        staged.gain,
        staged.stage,
        picked.snapshot is not null as selected,
        picked.selection_reason,
        seen.skip_reason,
        coalesce(staged.is_eligible, false) as is_eligible,
        seen.eval_ok_json,
        seen.score_problem,
        seen.attempt_file,
        seen.attempt_status,
        seen.path,
        seen.eval_count,
        seen.shared_state_hash,
        staged.i as candidate_index
    from seen
    left join staged on seen.run_id = staged.run_id and seen.task = staged.task and seen.snapshot = staged.snapshot
    left join picked on seen.run_id = picked.run_id and seen.task = picked.task and seen.snapshot = picked.snapshot
)

select * from final
