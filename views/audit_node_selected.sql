-- Recorded selections that the log prefix they saw does not imply (empty when healthy).
-- grain: run_id, kind, seq, subject, problem
-- sources: stg_node_selected, int_next_work
--
-- Needs `set variable asof_points = 'decisions'` (replay sets it): each decision is
-- re-derived at its own watermark, where the tree's next work must be a selection
-- of the same node with the same Select, Q and T (within 1e-9).
with checked as (
    select
        r.run_id,
        r.seq,
        r.tree_id,
        r.node_id as subject,
        case
            when w.tree_id is null then 'no selection was due at the watermark'
            when w.kind <> 'select' then 'a ' || w.kind || ' start was due instead'
            when w.parent_id <> r.node_id then 'another node had the highest Select'
            when
                differs(w.select_score, r.select_score)
                or differs(w.q, r.q)
                or differs(w.t, r.t)
                then 'scores differ'
        end as problem,
        r.node_id || format(' (select {:.6f}, q {:.6f}, t {:.6f})', r.select_score, r.q, r.t)
            as recorded,
        coalesce(
            w.parent_id || format(' (select {:.6f}, q {:.6f}, t {:.6f})', w.select_score, w.q, w.t),
            w.kind || ' ' || w.edge_id,
            'nothing'
        ) as derived
    from stg_node_selected as r
    left join int_next_work as w
        on r.run_id = w.run_id and r.tree_id = w.tree_id and r.watermark = w.asof_seq and w.pick = 1
)

select run_id, seq, 'node_selected' as kind, tree_id, subject, problem, recorded, derived
from checked
where problem is not null
