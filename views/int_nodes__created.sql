-- One row per tree node: the root of each tree and the child of every kept edge (static facts).
-- grain: run_id, tree_id, node_id
-- sources: stg_root_added, int_edges__judged, run_config
-- materialized: table
--
-- score is raw and may be null under the layer-1/2 exemptions; score_o is oriented.
-- last_turn_score_o is the node's last numeric turn score (turn 2, else turn 1; the
-- snapshot score for a root): where the next edge's turn 1 starts from (ALGORITHM §2).
-- created_seq is the seq from which the node exists (root added, edge complete).
with roots as (
    select
        r.run_id,
        r.tree_id,
        r.tree_id as node_id,
        cast(null as varchar) as parent_id,
        0 as depth,
        r.score,
        oriented(r.score, c.direction) as score_o,
        cast(0 as bigint) as tok,
        r.seq as created_seq,
        cast(null as varchar) as edge_id,
        oriented(r.score, c.direction) as last_turn_score_o,
        cast(null as varchar) as state
    from stg_root_added as r
    inner join run_config as c on r.run_id = c.run_id
    qualify row_number() over (partition by r.run_id, r.tree_id order by r.seq) = 1
),

children as (
    select
        run_id,
        tree_id,
        child_id as node_id,
        parent_id,
        layer as depth,
        edge_score as score,
        edge_score_o as score_o,
        tok,
        completed_seq as created_seq,
        edge_id,
        coalesce(s2_o, s1_o) as last_turn_score_o,
        end_state as state
    from int_edges__judged
    where child_id is not null
),

final as (
    select * from roots
    union all
    select * from children
)

select * from final
