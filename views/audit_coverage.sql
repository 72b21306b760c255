-- Coverage figures that cannot be right: a selected path not ranked, quota picks beyond a quota, N_eff above N (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: paths, snapshot_stages, coverage, learnability
--
-- Replay and `audit` read every audit_* view. N_eff can never exceed N (each path
-- owns at most its own edges) nor be negative; a stage cannot hold more quota picks
-- than its quota (fills are counted apart); the learnability share lies in [0, 1].
with problems as (
    select
        run_id,
        tree_id,
        tree_id || ':' || leaf_id as subject,
        'selected path not ranked' as problem,
        'selected, rank ' || coalesce(cast(rank as varchar), 'none') as recorded,
        'not ranked' as derived
    from paths
    where selected and not ranked
    union all
    select
        run_id,
        null,
        task || ':' || stage,
        'quota picks beyond the quota',
        cast(picked_quota as varchar) || ' quota picks',
        'quota ' || cast(quota as varchar)
    from snapshot_stages
    where picked_quota > quota
    union all
    select
        run_id,
        null,
        stratum || ':' || stratum_key,
        case when n_eff < 0 then 'N_eff below 0' else 'N_eff above N' end,
        'N_eff ' || cast(n_eff as varchar),
        'N ' || cast(selected_paths as varchar)
    from coverage
    where n_eff > selected_paths + 1e-9 or n_eff < -1e-9
    union all
    select
        run_id,
        tree_id,
        tree_id,
        'learnability share outside [0, 1]',
        cast(improved_share as varchar),
        cast(improved_edges as varchar) || ' of ' || cast(kept_edges as varchar) || ' kept edges'
    from learnability
    where improved_share < 0 or improved_share > 1
)

select
    run_id,
    cast(null as bigint) as seq,
    'coverage' as kind,
    tree_id,
    subject,
    problem,
    recorded,
    derived
from problems
