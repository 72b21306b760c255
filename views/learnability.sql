-- Per root: the share of its kept edges that improved, and whether it lies outside the learnability band (ALGORITHM §5).
-- grain: run_id, tree_id
-- sources: trees, edges
--
-- Kept edges: verdict kept or kept_exempt; a kept edge whose improved is null (no
-- score) counts as not improved. band: never (share 0) or always (share 1) - a root
-- the Teacher never or always improves on teaches little - else learnable; null for
-- a root without kept edges. flagged: band is never or always.
with counts as (
    select
        run_id,
        tree_id,
        count(*) filter (where verdict in ('kept', 'kept_exempt')) as kept_edges,
        count(*) filter (where verdict in ('kept', 'kept_exempt') and improved) as improved_edges
    from edges
    group by all
),

shared as (
    select
        t.run_id,
        t.tree_id,
        t.task,
        t.stage,
        t.snapshot,
        coalesce(c.kept_edges, 0) as kept_edges,
        coalesce(c.improved_edges, 0) as improved_edges,
        case when c.kept_edges > 0 then c.improved_edges / c.kept_edges end as improved_share
    from trees as t
    left join counts as c using (run_id, tree_id)
)

select
    *,
    case
        when improved_share is null then null
        when improved_share = 0 then 'never'
        when improved_share = 1 then 'always'
        else 'learnable'
    end as band,
    coalesce(improved_share in (0, 1), false) as flagged
from shared
