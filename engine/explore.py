"""The live token-aware MCTS engine (SPEC §2).

The engine holds the run's log writer and a catalog mirroring every event it
stages, and decides only by reading views: ``int_next_work`` says which edge a
tree should start next (a root direction, an owed retry, or the Select winner),
``int_edges__scored`` gives an edge's skip rule and verdict, ``int_trees__asof``
a tree's stop condition. Every decision records the seq of the last event the
query saw as its watermark.

Scheduling. ``parallel`` slots (the Teacher endpoint's concurrency) are shared by
all trees; a free slot goes to the next tree in round-robin tree-id order that
has work (a root's directions are taken together). Two modes:

- ``rounds`` (default): select a batch for every free slot, run it concurrently,
  record it in batch order (all turn 1s, then all turn 2s with their verdicts),
  then select again. The log is a function of the seed and settings only. A turn
  that finished but waits for an earlier one is kept in the run's spool, so a kill
  loses no finished turn.
- ``async``: record each turn as it finishes and refill a slot as soon as it frees.

Resume rebuilds everything from the log: edges in flight are finished (turns already
recorded or spooled are never run again), missing decisions are recorded, and the
loop continues.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.catalog import Catalog
from engine.config import RunConfig
from engine.paths import default_parameters, selection_decision
from engine.teacher import RootInfo, Teacher, TurnCancelled, TurnRequest
from ingest.errors import ProjectError
from ingest.events import (
    EdgeJudged,
    EdgeStarted,
    EvalFinished,
    Event,
    NodeSelected,
    RunFinished,
    RunResumed,
    TreeStopped,
    TurnFinished,
    TurnSkipped,
    from_row,
    to_arrow,
)
from ingest.log import LogWriter

SKIP_REASON = "turn 1 returned no score and the edge can no longer be kept"
SPOOL_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # spooled rows are renumbered when appended


class TeacherFailedError(ProjectError):
    """The Teacher backend failed in a way the engine cannot record as a turn."""


@dataclass
class EdgeRun:
    """An edge attempt the engine has started and not yet judged."""

    tree_id: str
    edge_id: str
    parent_id: str
    slot: int
    attempt: int
    parent_state: dict[str, Any]
    turn1_state: dict[str, Any] | None = None
    done_turns: set[int] = field(default_factory=set)
    complete: bool = False
    judged: bool = False


class Spool:
    """Finished turns waiting to be appended in order (rounds mode).

    One Arrow IPC file per turn under ``<run>/spool/`` (a private cache, not the log:
    cheaper to write than Parquet, and exact), written to a temporary name and renamed,
    so a killed process leaves the whole file or none; a file is removed once its turn
    is in the log. Files are not fsynced (that cost more than a zero-latency turn): the
    spool only spares re-running a turn after a kill, and a file that a crash of the
    machine left unreadable is dropped, so its turn runs again. Workers write one at a
    time: building Arrow arrays releases the GIL at every call, and 32 threads doing it
    at once took 3x as long as one after another (measured with the sim Teacher).
    """

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / "spool"
        self._lock = threading.Lock()

    def _path(self, edge_id: str, turn: int) -> Path:
        return self.dir / f"{edge_id.replace('/', '~')}--t{turn}.arrow"

    def put(self, edge_id: str, turn: int, facts: list[Event]) -> None:
        final = self._path(edge_id, turn)
        tmp = final.with_name(f".tmp-{final.name}")
        with self._lock:
            table = to_arrow(facts, "spool", 1, SPOOL_TIME)
            try:
                self.dir.mkdir(exist_ok=True)
                with open(tmp, "wb") as fh, pa.ipc.new_file(fh, table.schema) as out:
                    out.write_table(table)
                os.rename(tmp, final)
            except OSError:  # only a cache: the turn is kept in memory until the log has it
                tmp.unlink(missing_ok=True)

    def take(self, edge_id: str, turn: int) -> list[Event] | None:
        path = self._path(edge_id, turn)
        if not path.exists():
            return None
        try:
            with pa.ipc.open_file(path) as spooled:
                rows = spooled.read_all().to_pylist()
        except (OSError, pa.ArrowInvalid):  # torn by a machine crash: run the turn again
            path.unlink(missing_ok=True)
            return None
        return [from_row(r) for r in rows]

    def drop(self, edge_id: str, turn: int) -> None:
        self._path(edge_id, turn).unlink(missing_ok=True)

    def clear(self) -> None:
        if self.dir.exists():
            for p in self.dir.iterdir():
                p.unlink()
            self.dir.rmdir()


class Progress:
    """Status on stderr: a live line on a terminal, else a line every ``period`` seconds."""

    def __init__(self, catalog: Catalog, enabled: bool | None = None, period: float = 60.0) -> None:
        self.catalog = catalog
        self.enabled = enabled is not False
        self.live = sys.stderr.isatty() if enabled is None else bool(enabled)
        self.period = 1.0 if self.live else period
        self.start = time.monotonic()
        self.last = time.monotonic()
        self.facts = 0

    def fact(self, _event: Event) -> None:
        self.facts += 1

    def line(self, in_flight: int) -> str:
        row = self.catalog.query("select * from run_progress")[0]
        elapsed = time.monotonic() - self.start
        return (
            f"trees {row['trees_done']}/{row['trees']} done, {row['trees_running']} running | "
            f"edges kept {row['edges_kept']} pruned {row['edges_pruned']} "
            f"retried {row['edges_retried']} | leaves {row['leaves']} | "
            f"in flight {in_flight} | {elapsed:,.0f}s"
        )

    def update(self, in_flight: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < self.period):
            return
        self.last = now
        if self.live:
            sys.stderr.write("\r\033[K" + self.line(in_flight))
        else:
            sys.stderr.write(self.line(in_flight) + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.live:
            sys.stderr.write("\n")
            sys.stderr.flush()


class Explorer:
    """Grows every tree of one run until all have stopped."""

    def __init__(
        self,
        writer: LogWriter,
        catalog: Catalog,
        config: RunConfig,
        teacher: Teacher,
        progress: Progress | None = None,
    ) -> None:
        self.writer = writer
        self.catalog = catalog
        self.config = config
        self.teacher = teacher
        self.progress = progress
        self.cancel = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=config.parallel, thread_name_prefix="teacher")
        self.spool = Spool(writer.log.dir) if config.schedule == "rounds" else None
        self.roots = {
            r["tree_id"]: RootInfo(r["tree_id"], r["path"], r["score"], r["commit_hash"])
            for r in catalog.query("select * from stg_root_added order by tree_id")
        }
        self.trees = sorted(self.roots)
        self.direction = catalog.query("select direction from run_config")[0]["direction"]
        self.rr = self._round_robin_position()
        self.in_flight: dict[str, EdgeRun] = {}
        self.root_states: dict[str, dict[str, Any]] = {}
        self.stopped = {r["tree_id"] for r in catalog.query("select tree_id from stg_tree_stopped")}
        self._skipped = {r["edge_id"] for r in catalog.query("select edge_id from stg_turn_skipped")}

    # ------------------------------------------------------------ recording

    def _stage(self, events: list[Event]) -> None:
        self.catalog.insert(self.writer.stage(events))

    def _flush(self) -> None:
        self.writer.flush()

    # ---------------------------------------------------------------- views

    def _work_rows(self, trees: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Each tree's starts due, in order (all trees, or those listed)."""
        if trees is None:
            rows = self.catalog.query("select * from int_next_work order by tree_id, pick")
        else:
            rows = self.catalog.query(
                "select * from int_next_work where tree_id in (select unnest(?)) "
                "order by tree_id, pick",
                [sorted(trees)],
            )
        work: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            work.setdefault(row["tree_id"], []).append(row)
        return work

    def _edge_rows(self, runs: list[EdgeRun]) -> dict[str, dict[str, Any]]:
        """Skip rule, verdict and child id of each run."""
        if not runs:
            return {}
        rows = self.catalog.query(
            "select * from int_edges__judged where edge_id in (select unnest(?))",
            [[r.edge_id for r in runs]],
        )
        return {r["edge_id"]: r for r in rows}

    def _record_stops(self) -> None:
        """Record TreeStopped for every tree whose stop condition now holds."""
        rows = self.catalog.query(
            "select tree_id, asof_seq, stop_reason from int_trees__asof "
            "where is_now and stop_reason is not null order by tree_id"
        )
        stops = []
        for row in rows:
            if row["tree_id"] not in self.stopped:
                stops.append(TreeStopped(watermark=row["asof_seq"], tree_id=row["tree_id"],
                                         reason=row["stop_reason"]))  # fmt: skip
                self.stopped.add(row["tree_id"])
        self._stage(stops)

    # ------------------------------------------------------------- starting

    def _root_state(self, tree_id: str) -> dict[str, Any]:
        if tree_id not in self.root_states:
            self.root_states[tree_id] = self.teacher.root_state(self.roots[tree_id])
        return self.root_states[tree_id]

    def _parent_state(self, tree_id: str, parent_id: str, state_json: str | None) -> dict[str, Any]:
        if parent_id == tree_id:
            return self._root_state(tree_id)
        return json.loads(state_json) if state_json else {}

    def _start(self, work: dict[str, Any]) -> EdgeRun:
        events: list[Event] = []
        if work["kind"] == "select":
            events.append(
                NodeSelected(
                    watermark=work["asof_seq"], tree_id=work["tree_id"], node_id=work["parent_id"],
                    select_score=work["select_score"], q=work["q"], t=work["t"],
                )
            )  # fmt: skip
        events.append(
            EdgeStarted(
                tree_id=work["tree_id"], edge_id=work["edge_id"], parent_id=work["parent_id"],
                slot=work["slot"], attempt=work["attempt"],
            )
        )  # fmt: skip
        self._stage(events)
        run = EdgeRun(
            work["tree_id"], work["edge_id"], work["parent_id"], work["slot"], work["attempt"],
            self._parent_state(work["tree_id"], work["parent_id"], work["parent_state"]),
        )  # fmt: skip
        self.in_flight[run.edge_id] = run
        return run

    def _round_robin_position(self) -> int:
        """Where the round-robin resumes, read from the last edge started.

        A fill stops right after a start (or goes round every tree), so the next
        tree is the one after the last tree that started an edge, or that same
        tree when its start was a root direction (its directions go together).
        """
        rows = self.catalog.query(
            "select tree_id, parent_id, attempt from stg_edge_started order by seq desc limit 1"
        )
        if not rows or rows[0]["tree_id"] not in self.trees:
            return 0
        last = rows[0]
        fanout = last["parent_id"] == last["tree_id"] and last["attempt"] == 1
        return self.trees.index(last["tree_id"]) + (0 if fanout else 1)

    def _fill(self) -> list[EdgeRun]:
        """Start edges for every free slot, round-robin over trees (SPEC §2).

        One query gives every tree's starts due (int_next_work). A tree is queried
        again (those trees together) when the round-robin comes back to it after
        it started its Select winner (which changes the next one), or when its next
        start is a selection (recorded with the watermark of the query that chose
        it, which must see the tree's starts before it).
        """
        self._record_stops()
        free = self.config.parallel - len(self.in_flight)
        started: list[EdgeRun] = []
        if free <= 0 or not self.trees:
            return started
        work = self._work_rows()
        stale: set[str] = set()
        n, idle, i = len(self.trees), 0, self.rr
        while free > 0 and idle < n:
            tree = self.trees[i % n]
            if tree in stale:
                for t in stale:
                    work.pop(t, None)
                work.update(self._work_rows(list(stale)))
                stale.clear()
            rows = work.get(tree)
            if not rows or tree in self.stopped:
                idle += 1
                i += 1
                continue
            row = rows.pop(0)
            started.append(self._start(row))
            free -= 1
            idle = 0
            if row["kind"] == "select" or (rows and rows[0]["kind"] == "select"):
                stale.add(tree)
            if row["kind"] != "fanout":  # a root's directions start together
                i += 1
        self.rr = i % n
        return started

    # ------------------------------------------------------------ the turns

    def _request(self, run: EdgeRun, turn: int) -> TurnRequest:
        start = run.parent_state if turn == 1 else run.turn1_state
        return TurnRequest(
            tree_id=run.tree_id, edge_id=run.edge_id, parent_id=run.parent_id, turn=turn,
            slot=run.slot, attempt=run.attempt, start_state=start or {}, fork=turn == 1,
            direction=self.direction,
            timeout_s=self.config.backend_options.get("turn_timeout_s"),
        )  # fmt: skip

    def _run_turn(self, run: EdgeRun, turn: int) -> list[Event]:
        on_fact = self.progress.fact if self.progress else (lambda _e: None)
        facts = self.teacher.run_turn(self._request(run, turn), on_fact, self.cancel)
        if not facts or not isinstance(facts[-1], TurnFinished):
            raise TeacherFailedError(f"{run.edge_id} turn {turn}: the backend returned no TurnFinished")
        if not any(isinstance(f, EvalFinished) for f in facts):
            raise TeacherFailedError(f"{run.edge_id} turn {turn}: the backend returned no EvalFinished")
        if self.spool is not None:
            self.spool.put(run.edge_id, turn, facts)
        return facts

    def _stage_turn(self, run: EdgeRun, turn: int, facts: list[Event]) -> None:
        self._stage(facts)
        self._turn_done(run, turn, facts)

    def _turn_done(self, run: EdgeRun, turn: int, facts: list[Event]) -> None:
        run.done_turns.add(turn)
        if turn == 1:
            run.turn1_state = facts[-1].state
        else:
            run.complete = True

    def _decide_skips(self, runs: list[EdgeRun]) -> None:
        """After turn 1: record the skip of turn 2 where the edge can no longer be kept."""
        rows = self._edge_rows(runs)
        watermark = self.writer.tail
        skips = []
        for run in runs:
            if rows[run.edge_id]["skip_turn2"]:
                skips.append(TurnSkipped(watermark=watermark, tree_id=run.tree_id,
                                         edge_id=run.edge_id, turn=2, reason=SKIP_REASON))  # fmt: skip
                self._skipped.add(run.edge_id)
                run.complete = True
        self._stage(skips)

    def _judge(self, runs: list[EdgeRun]) -> None:
        """Record the verdicts of complete edges (each once)."""
        runs = [r for r in runs if not r.judged]
        rows = self._edge_rows(runs)
        watermark = self.writer.tail
        events: list[Event] = []
        for run in runs:
            row = rows[run.edge_id]
            if row["verdict"] is None:
                raise TeacherFailedError(f"{run.edge_id}: judged before it was complete")
            events.append(EdgeJudged(watermark=watermark, tree_id=run.tree_id, edge_id=run.edge_id,
                                     verdict=row["verdict"], child_id=row["child_id"]))  # fmt: skip
            run.judged = True
            self.in_flight.pop(run.edge_id, None)
            if row["verdict"] in ("pruned", "retry"):
                for state in (run.turn1_state, json.loads(row["end_state"]) if row["end_state"] else None):
                    if state:
                        self.teacher.discard(state)
        self._stage(events)

    def _drop_spooled(self, runs: list[EdgeRun], turn: int) -> None:
        if self.spool is not None:
            for run in runs:
                self.spool.drop(run.edge_id, turn)

    # ---------------------------------------------------------------- loops

    def run(self) -> None:
        """Explore until every tree has stopped and nothing is in flight."""
        try:
            if self.config.schedule == "rounds":
                self._run_rounds()
            else:
                self._run_async()
            self._record_stops()
            weights, top_k = default_parameters(self.catalog)
            self._stage([selection_decision(self.catalog, self.writer.tail, weights, top_k)])
            self._stage([RunFinished()])
            self._flush()
            if self.spool is not None:
                self.spool.clear()
        except BaseException:
            self.cancel.set()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self._flush_safely()
            raise
        finally:
            self.pool.shutdown(wait=True)
            if self.progress:
                self.progress.close()

    def _flush_safely(self) -> None:
        with contextlib.suppress(Exception):  # the original error matters more
            self._flush()

    def _result(self, future: Future) -> list[Event]:
        try:
            return future.result()
        except TurnCancelled:
            raise
        except ProjectError:
            raise
        except Exception as err:
            raise TeacherFailedError(f"the {self.teacher.name} backend failed: {err!r}") from err

    def _run_rounds(self) -> None:
        batch = sorted(self.in_flight.values(), key=self._started_seq)
        while True:
            if not batch:
                batch = self._fill()
                self._flush()
            if not batch:
                return
            self._run_batch(batch)
            batch = []

    def _turn_facts(self, run: EdgeRun, turn: int) -> list[Event] | Future:
        spooled = self.spool.take(run.edge_id, turn) if self.spool else None
        if spooled is not None:
            return spooled
        return self.pool.submit(self._run_turn, run, turn)

    def _run_phase(self, runs: list[EdgeRun], turn: int) -> list[EdgeRun]:
        """Run one turn of every run concurrently and stage the results in batch order.

        The phase's facts are staged together (one Arrow batch instead of one per
        turn); the turns that finished are staged even when a later one failed.
        """
        todo = [r for r in runs if turn not in r.done_turns and not r.complete]
        pending = {r.edge_id: self._turn_facts(r, turn) for r in todo}
        done: list[Event] = []
        try:
            for run in todo:
                result = pending[run.edge_id]
                facts = result if isinstance(result, list) else self._result(result)
                done.extend(facts)
                self._turn_done(run, turn, facts)
                self._progress()
        finally:
            self._stage(done)
        return todo

    def _run_batch(self, batch: list[EdgeRun]) -> None:
        """Turn 1 of every edge, the skips, turn 2, then every verdict, in batch order."""
        ran = self._run_phase(batch, 1)
        self._decide_skips([r for r in batch if 1 in r.done_turns and 2 not in r.done_turns
                            and not r.complete and self._needs_skip_check(r)])  # fmt: skip
        # An edge whose turn 2 is skipped is complete: judge it in the same flush, so
        # that every published prefix holds the verdict of every finished edge.
        self._judge([r for r in batch if r.complete and 2 not in r.done_turns])
        self._flush()
        self._drop_spooled(ran, 1)
        ran = self._run_phase(batch, 2)
        self._judge(batch)
        self._flush()
        self._drop_spooled(ran, 2)
        self._progress()

    def _needs_skip_check(self, run: EdgeRun) -> bool:
        return run.edge_id not in self._skipped

    def _run_async(self) -> None:
        done: queue.Queue = queue.Queue()

        def submit(run: EdgeRun, turn: int) -> None:
            future = self.pool.submit(self._run_turn, run, turn)
            future.add_done_callback(lambda f: done.put((run, turn, f)))

        for run in sorted(self.in_flight.values(), key=self._started_seq):
            if run.complete:
                self._judge([run])
            else:
                submit(run, 1 if 1 not in run.done_turns else 2)
        for run in self._fill():
            submit(run, 1)
        self._flush()
        while self.in_flight:
            run, turn, future = done.get()
            self._stage_turn(run, turn, self._result(future))
            if turn == 1:
                self._decide_skips([run])
            if run.complete:
                self._judge([run])
            else:
                submit(run, 2)
            for new in self._fill():
                submit(new, 1)
            self._flush()
            self._progress()

    def _progress(self) -> None:
        if self.progress:
            self.progress.update(len(self.in_flight))

    def _started_seq(self, run: EdgeRun) -> int:
        return self.catalog.query(
            "select seq from stg_edge_started where tree_id = ? and edge_id = ?",
            [run.tree_id, run.edge_id],
        )[0]["seq"]

    # --------------------------------------------------------------- resume

    def recover(self) -> None:
        """Rebuild the edges in flight from the log; the loops finish them first.

        Turns already recorded are never run again (nor are turns spooled in rounds
        mode); a skip or verdict a crash left out is recorded before anything starts.
        """
        self._stage([RunResumed(note="resumed from the log")])
        edges = self.catalog.query(
            """
            select e.*, n.state as parent_state
            from int_edges__started as e
            left join int_nodes__created as n on n.tree_id = e.tree_id and n.node_id = e.parent_id
            where e.edge_id not in (select edge_id from stg_edge_judged)
            order by e.started_seq
            """
        )
        for e in edges:
            run = EdgeRun(
                e["tree_id"], e["edge_id"], e["parent_id"], e["slot"], e["attempt"],
                self._parent_state(e["tree_id"], e["parent_id"], e["parent_state"]),
            )  # fmt: skip
            if e["turn1_seq"] is not None:
                run.done_turns.add(1)
                run.turn1_state = json.loads(e["turn1_state"]) if e["turn1_state"] else {}
            if e["turn2_seq"] is not None:
                run.done_turns.add(2)
            run.complete = e["turn2_seq"] is not None or (
                bool(e["skip_turn2"]) and e["edge_id"] in self._skipped
            )
            self.in_flight[run.edge_id] = run
        # A skip whose decision the crash lost is recorded now, in start order.
        self._decide_skips([r for r in self.in_flight.values() if 1 in r.done_turns
                            and 2 not in r.done_turns and self._needs_skip_check(r)])  # fmt: skip
        self._flush()
