-- One row per edge attempt started and not judged yet, with what it needs next (ALGORITHM §2).
-- grain: run_id, tree_id, edge_id
-- sources: stg_edge_started, stg_edge_judged, stg_turn_skipped, int_edges__judged, int_nodes__created
--
-- next_step: turn_1 (turn 1 has not finished); skip_turn_2 (turn 1 returned no
-- score and the edge can no longer be kept, and no skip is recorded yet); turn_2;
-- judge (turn 2 finished, or its skip is recorded: the verdict is due). The live
-- engine acts on these rows, and a resumed run goes on from them.
-- parent_state is the checkpoint turn 1 forks (null at a root: the backend's own
-- root state); turn1_state the one turn 2 continues from.
with open_edges as (
    select *
    from stg_edge_started
    anti join stg_edge_judged using (run_id, tree_id, edge_id)
),

skips as (
    select distinct
        run_id,
        tree_id,
        edge_id
    from stg_turn_skipped
),

final as (
    select
        o.run_id,
        o.tree_id,
        o.edge_id,
        o.parent_id,
        o.slot,
        o.attempt,
        o.seq as started_seq,
        p.state as parent_state,
        e.turn1_seq,
        e.turn1_state,
        e.turn2_seq,
        k.edge_id is not null as skip_recorded,
        case
            when e.turn1_seq is null then 'turn_1'
            when e.turn2_seq is not null or k.edge_id is not null then 'judge'
            when e.skip_turn2 then 'skip_turn_2'
            else 'turn_2'
        end as next_step,
        e.verdict,
        e.child_id,
        e.end_state
    from open_edges as o
    left join int_edges__judged as e on o.run_id = e.run_id and o.tree_id = e.tree_id and o.edge_id = e.edge_id
    left join skips as k on o.run_id = k.run_id and o.tree_id = k.tree_id and o.edge_id = k.edge_id
    left join int_nodes__created as p on o.run_id = p.run_id and o.tree_id = p.tree_id and o.parent_id = p.node_id
)

select * from final
