-- Per weighting, candidate path and point: whether the path is selected, and its rank in the selection (ALGORITHM §3).
-- grain: run_id, selection_seq, tree_id, asof_seq, leaf_id
-- sources: int_paths__scored, int_paths__greedy
--
-- Without a diversity lambda: the Top-k by PathScore (rank <= top_k). With one: the
-- greedy picks of int_paths__greedy, rank being the step that picked the path
-- (null for the paths not picked).
select
    s.* exclude (rank, top_k),
    case when s.diversity is null then s.rank else g.pick end as rank,
    case when s.diversity is null then coalesce(s.rank <= s.top_k, false) else g.pick is not null end
        as selected,
    g.gain as n_eff_gain
from int_paths__scored as s
left join int_paths__greedy as g
    on
        s.run_id = g.run_id
        and s.selection_seq = g.selection_seq
        and s.tree_id = g.tree_id
        and s.asof_seq = g.asof_seq
        and s.leaf_id = g.leaf_id
