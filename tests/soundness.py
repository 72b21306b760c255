"""What a sound run's log looks like, checked from outside the engine (tests and the soak script)."""

from __future__ import annotations

from pathlib import Path

from engine.catalog import Catalog
from ingest.log import EventLog
from ingest.schema import WALL_CLOCK_COLUMNS


def logical_log(data_dir: Path, run_id: str) -> list[dict]:
    """Every event of a run without its wall-clock columns and run id."""
    table = EventLog(data_dir, run_id).read_table()
    drop = [c for c in table.column_names if c in WALL_CLOCK_COLUMNS or c == "run_id"]
    return table.drop_columns(drop).to_pylist()


def tree_shape(data_dir: Path, run_id: str, cat: Catalog | None = None) -> dict:
    """What a run grew: nodes, edge verdicts and tree stops (ids included)."""
    cat = cat or Catalog.for_log(EventLog(data_dir, run_id))
    return {
        "nodes": cat.query("select node_id, parent_id, depth, score, tok, leaf_reason from nodes order by node_id"),
        "edges": cat.query("select edge_id, parent_id, child_id, verdict, s1, s2 from edges order by edge_id"),
        "trees": cat.query("select tree_id, stop_reason from trees order by tree_id"),
    }


def assert_log_is_sound(data_dir: Path, run_id: str, cat: Catalog | None = None) -> None:
    """A finished run: no turn recorded twice, every edge started once, judged once, finished."""
    cat = cat or Catalog.for_log(EventLog(data_dir, run_id))
    dup = cat.query("select edge_id, turn, count(*) as n from stg_turn_finished group by all having n > 1")
    assert dup == [], "a finished turn was recorded twice"
    started = cat.query("select edge_id from stg_edge_started group by all having count(*) > 1")
    assert started == [], "an edge was started twice"
    unjudged = cat.query(
        "select edge_id from stg_edge_started where edge_id not in (select edge_id from stg_edge_judged)"
    )
    assert unjudged == []
    twice = cat.query("select edge_id from stg_edge_judged group by all having count(*) > 1")
    assert twice == []
    lost = cat.query("select edge_id from edges where completed_seq is null")
    assert lost == [], "an edge never finished"
    assert cat.query("select count(*) as n from stg_run_finished")[0]["n"] == 1
