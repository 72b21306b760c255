-- One row per recorded selection decision: the node a free slot expanded (public, ALGORITHM §7).
-- grain: seq
-- sources: stg_node_selected
select
    seq,
    watermark,
    tree_id,
    node_id,
    select_score as "select",
    q,
    t
from stg_node_selected
