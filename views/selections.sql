-- One row per recorded selection decision: the node a free slot expanded (public, ALGORITHM §7).
-- grain: run_id, seq
-- sources: stg_node_selected
select
    run_id,
    seq,
    watermark,
    tree_id,
    node_id,
    select_score as "select",
    q,
    t
from stg_node_selected
