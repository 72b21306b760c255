"""Property test: the engine over random Teacher outcomes keeps the tree invariants of ALGORITHM §2."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.catalog import Catalog
from engine.config import RunConfig, TreeConfig
from engine.mcts.explorer import Explorer
from engine.teachers import RootInfo, TurnRequest
from ingest.events import (
    EvalFinished,
    RootAdded,
    RunStarted,
    StepFinished,
    ToolCalled,
    TurnFinished,
)
from ingest.log import EventLog, LogWriter

outcome = st.fixed_dictionaries(
    {
        "score": st.one_of(st.none(), st.floats(0.0, 3.0, allow_nan=False).map(lambda x: round(x, 2))),
        "calls": st.integers(0, 6),
        "errors": st.integers(0, 6),
        "knowledge": st.booleans(),
        "tokens": st.integers(5_000, 20_000),
    }
)


class ScriptedTeacher:
    """Turn outcomes drawn by hypothesis, picked by (edge id, turn) whatever the scheduling."""

    name = "scripted"
    version = "scripted"

    def __init__(self, outcomes: list[dict]) -> None:
        self.outcomes = outcomes

    def root_state(self, root: RootInfo) -> dict:
        return {"ctx": 0}

    def discard(self, state: dict) -> None:
        return None

    def close(self) -> None:
        return None

    def run_turn(self, req: TurnRequest, cancel: threading.Event) -> list:
        h = int(hashlib.sha256(f"{req.edge_id}|{req.turn}".encode()).hexdigest(), 16)
        o = self.outcomes[h % len(self.outcomes)]
        ids = {"tree_id": req.tree_id, "edge_id": req.edge_id, "turn": req.turn}
        facts: list = []
        for i in range(o["calls"]):
            target = ".opencode/notes/a.md" if o["knowledge"] and i == 0 else "src/a.py"
            facts.append(
                ToolCalled(
                    **ids,
                    step=1,
                    call_id=str(i),
                    tool="read",
                    status="error" if i < o["errors"] else "ok",
                    target=target,
                )
            )
        ctx = int(req.start_state.get("ctx", 0)) + o["tokens"]
        facts.append(StepFinished(**ids, step=1, tokens_total=ctx))
        facts.append(EvalFinished(**ids, score=o["score"]))
        facts.append(TurnFinished(**ids, context_tokens=ctx, state={"ctx": ctx}))
        return facts


def run_engine(data_dir: Path, run_id: str, outcomes, trees: int, config: RunConfig) -> Catalog:
    catalog = Catalog.empty(threads=1)
    started = RunStarted(command="explore", task="t", config=config.model_dump(mode="json"))
    roots = [
        RootAdded(tree_id=f"T{i:03d}", task="t", snapshot=f"s{i}", path="/x", score=1.0) for i in range(1, trees + 1)
    ]
    with LogWriter.create(data_dir, run_id) as writer:
        catalog.insert(writer.stage([started, *roots]))
        writer.flush()
        Explorer(writer, catalog, config, ScriptedTeacher(outcomes)).run()
    return catalog


def rounded(rows: list[dict]) -> list[str]:
    """Rows comparable across thread counts (float sums may differ in the last bit)."""
    return sorted(repr({k: round(v, 9) if isinstance(v, float) else v for k, v in row.items()}) for row in rows)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    outcomes=st.lists(outcome, min_size=3, max_size=12),
    trees=st.integers(1, 3),
    target=st.integers(2, 6),
    parallel=st.integers(1, 4),
    schedule=st.sampled_from(["rounds", "async"]),
)
def test_tree_invariants_hold_over_random_outcomes(tmp_path_factory, outcomes, trees, target, parallel, schedule):
    data = tmp_path_factory.mktemp("prop")
    config = RunConfig(task="t", parallel=parallel, schedule=schedule, tree=TreeConfig(target_good_leaves=target))
    live = run_engine(data, "p", outcomes, trees, config)
    cat = Catalog.for_log(EventLog(data, "p"))

    nodes = cat.query("select * from nodes")
    by_id = {n["node_id"]: n for n in nodes}
    for n in nodes:
        limit = 3 if n["depth"] == 0 else 2
        assert n["valid_children"] <= limit, n
        assert n["depth"] <= 4
        if n["depth"] == 0:
            assert n["valid_children"] == 3, "layer 1 always has 3 children"
        else:
            assert by_id[n["parent_id"]]["depth"] == n["depth"] - 1
    edges = cat.query("select * from edges")
    for e in edges:
        assert e["verdict"] is not None
        assert (e["child_id"] is None) == (e["verdict"] in ("pruned", "retry"))
    kept_parents = {e["child_id"]: e["verdict"] for e in edges if e["child_id"]}
    assert all(kept_parents[n["node_id"]] in ("kept", "kept_exempt") for n in nodes if n["depth"])
    # No edge starts after its tree stopped (those in flight finish normally).
    late = cat.query(
        """
        select s.edge_id from stg_edge_started as s
        inner join stg_tree_stopped as t on s.tree_id = t.tree_id and s.seq > t.seq
        """
    )
    assert late == []
    # Every tree is done, and every childless non-root node is a leaf with a reason.
    assert {t["status"] for t in cat.query("select status from trees")} == {"done"}
    for n in nodes:
        if n["depth"] > 0 and n["valid_children"] == 0:
            assert n["leaf_reason"] in ("depth", "token", "exhausted", "stopped"), n
    # The tables the engine kept up to date tree by tree equal a rebuild from the log.
    # (As-of rows are compared without their point: each tree's "now" is its last change.
    # A whole-run table, such as the snapshot picks, is recomputed whole when read.)
    for table in cat.tables:
        sql = f"select * from {table}"
        if "asof_seq" in cat.views[table].grain:
            columns = {row[0] for row in cat.con.execute(f"describe {table}").fetchall()}
            now = " where is_now" if "is_now" in columns else ""  # a whole-run table: all its points
            sql = f"select * exclude (asof_seq) from {table}{now}"
        assert rounded(live.query(sql)) == rounded(cat.query(sql)), table
