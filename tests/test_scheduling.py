"""Scheduling turns: the pool's queue order, edges started ahead of free slots (async lookahead)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.catalog import Catalog
from engine.config import RunConfig, TreeConfig
from engine.mcts.explorer import Explorer, lookahead
from engine.mcts.turns import TurnPool
from engine.replay import replay_run
from engine.teachers import TurnRequest
from engine.teachers.sim import SimTeacher
from ingest.events import EvalFinished, RootAdded, RunStarted, TurnFinished
from ingest.log import EventLog, LogWriter

DEADLINE_S = 120


def request(edge: str, turn: int) -> TurnRequest:
    return TurnRequest(
        tree_id="T1",
        edge_id=edge,
        parent_id="T1",
        turn=turn,
        slot=1,
        attempt=1,
        start_state={},
        fork=turn == 1,
        direction="maximize",
    )


class Gate:
    """A Teacher whose first turn waits for a gate; it records the order turns ran in."""

    name = "gate"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.order: list[tuple[str, int]] = []

    def run_turn(self, request: TurnRequest, cancel: threading.Event):
        self.order.append((request.edge_id, request.turn))
        if len(self.order) == 1:
            self.started.set()
            assert self.gate.wait(DEADLINE_S)
        ids = {"tree_id": request.tree_id, "edge_id": request.edge_id, "turn": request.turn}
        return [EvalFinished(**ids, score=1.0, eval_status="ok"), TurnFinished(**ids, outcome="completed", state={})]


def test_a_free_slot_takes_queued_turn_2s_first_each_in_submission_order():
    teacher = Gate()
    pool = TurnPool(teacher, slots=1)
    try:
        pool.submit(request("T1/e1-1", 1))
        assert teacher.started.wait(DEADLINE_S)  # the one slot is busy: the rest queue
        for edge, turn in [("T1/e2-1", 1), ("T1/e3-1", 2), ("T1/e4-1", 1), ("T1/e5-1", 2)]:
            pool.submit(request(edge, turn))
        teacher.gate.set()
        handed_back = []
        while pool.running:
            handed_back += [(r.edge_id, r.turn) for r, _ in pool.wait()]
    finally:
        pool.close()
    expected = [("T1/e1-1", 1), ("T1/e3-1", 2), ("T1/e5-1", 2), ("T1/e2-1", 1), ("T1/e4-1", 1)]
    assert teacher.order == expected and handed_back == expected


def test_closing_with_cancel_drops_the_queued_turns():
    teacher = Gate()
    pool = TurnPool(teacher, slots=1)
    pool.submit(request("T1/e1-1", 1))
    assert teacher.started.wait(DEADLINE_S)
    pool.submit(request("T1/e2-1", 1))
    teacher.gate.set()
    pool.close(cancel=True)
    assert ("T1/e2-1", 1) not in teacher.order


def test_auto_lookahead_covers_two_passes_of_finished_turns_and_at_most_the_slots():
    assert lookahead("auto", 16, None, 0.2) == 0 and lookahead("auto", 16, 0.5, None) == 0  # not timed yet
    assert lookahead("auto", 16, 120.0, 0.2) == 1  # real turns: one queued edge
    assert lookahead("auto", 16, 0.5, 0.15) == 10  # 2 x 16 x 0.15 / 0.5 = 9.6
    assert lookahead("auto", 16, 0.01, 0.5) == 16
    assert lookahead(3, 16, 0.01, 0.5) == 3


class Counting(SimTeacher):
    """The sim with timed turns, counting how many run at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def run_turn(self, request, cancel):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().run_turn(request, cancel)
        finally:
            with self.lock:
                self.now -= 1


def in_flight_at_each_start(data: Path, run_id: str) -> list[int]:
    """Edges started and not yet judged when each edge started (an independent count over the log)."""
    rows = EventLog(data, run_id).read_table(columns=["seq", "kind", "edge_id"]).to_pylist()
    started: set[str] = set()
    out = []
    for row in rows:
        if row["kind"] == "edge_started":
            started.add(row["edge_id"])
            out.append(len(started))
        elif row["kind"] == "edge_judged":
            started.discard(row["edge_id"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [0, 2])
def test_async_lookahead_starts_edges_beyond_the_slots_but_never_runs_more_turns(tmp_path, ahead):
    parallel = 3
    config = RunConfig(
        task="t",
        parallel=parallel,
        lookahead=ahead,
        schedule="async",
        seed=3,
        tree=TreeConfig(target_good_leaves=3),
        backend_options={"latency_s": 0.02},
    )
    teacher = Counting(config.seed, config.backend_options)
    roots = [RootAdded(tree_id=f"T{i}", task="t", snapshot=f"s{i}", path="/x", score=float(i)) for i in (1, 2)]
    with LogWriter.create(tmp_path, "ahead") as writer:
        catalog = Catalog.empty(threads=1)
        catalog.insert(
            writer.stage([RunStarted(command="explore", task="t", config=config.model_dump(mode="json")), *roots])
        )
        writer.flush()
        Explorer(writer, catalog, config, teacher).run()
    flights = in_flight_at_each_start(tmp_path, "ahead")
    assert max(flights) == parallel + ahead  # the first pass fills the slots and the lookahead
    assert teacher.most == parallel  # turns never outnumber the slots
    result = replay_run(tmp_path, "ahead")
    assert result.decisions > 0 and not result.differences
    trees = Catalog.for_log(EventLog(tmp_path, "ahead")).query("select status from trees")
    assert [t["status"] for t in trees] == ["done", "done"]
