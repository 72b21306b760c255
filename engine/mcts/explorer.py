"""The live token-aware MCTS engine (ALGORITHM §2): the loop that grows every tree of a run.

The engine keeps no state of its own: each step reads the views, turns their rows
into decisions (``decisions``) and starts the turns the edges need (``turns``)::

    until every tree has stopped and nothing is in flight:
        record each stop that is due               int_trees__stopping
        hand free slots to the trees in turn       int_rotation, int_next_work
            (root directions, owed retries, then the node with the highest Select)
        run the turns the open edges need          int_edges__open
        record their facts, then each skip of turn 2 and each verdict now due
    record the default Top-k path selection and the default supervision selection, then RunFinished

Every decision records the seq of the last event its query saw as its watermark.
A resumed run is the same loop over the log it finds: turns already recorded (or
spooled) are never run again, and decisions a crash left out are recorded first.

Scheduling. ``parallel`` slots (the Teacher endpoint's concurrency) are shared by
all trees. ``rounds``: start a batch for every free slot, run all its turn 1s
concurrently and record them in start order, then all its turn 2s; the log is a
function of the seed and settings (and the spool keeps finished turns of a batch
across a kill). ``async``: one pass of the loop serves every turn that finished
while the last pass ran, and starts edges for the free slots plus ``lookahead``
more, whose turns wait in the pool's queue (turn 2s first): a slot freed while the
engine decides takes a queued turn at once instead of waiting for the pass.

Backend errors. A turn whose Teacher process failed (``int_turns__failing``) is not
a rollout result worth keeping until another turn shows the backend works: while
the trailing streak of such turns is above zero nothing is published, and when it
reaches ``backend_error_limit`` the run stops with the error (exit 1), its failed
turns unpublished, so ``--resume`` after the fix runs them again. The turns one lost
Teacher process carried (a killed ``opencode serve``) count once in the streak.

A grader that cannot grade. Before the first turn (and on a resume whose last check
failed) a backend that can (``check_grader``: OpenCode with ``--coral-dir``) grades
the first root's own code, recorded as ``GraderChecked``; after every verdict the
streak of edges whose evals all failed with one error is read. ``int_run__stopping``
says when either stops the run: the engine records ``RunStopped`` and ends with the
error (exit 1), the turns before it recorded.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from engine.catalog import Catalog
from engine.config import RunConfig
from engine.derived.live import Keeper
from engine.mcts import decisions
from engine.mcts.spool import Spool
from engine.mcts.turns import Runner, TeacherFailedError, TurnPool, moving_average
from engine.selections import default_parameters, selection_decision
from engine.supervision import default_rule, supervision_decision
from engine.teachers import RootInfo, Teacher, TurnRequest
from ingest.events import ContentRecorded, Event, RunFinished, RunResumed, RunStopped
from ingest.faults import crash_point
from ingest.log import LogWriter
from ingest.paths import command_line

Row = dict[str, Any]
TURN_STEPS = {"turn_1": 1, "turn_2": 2}
OPEN_EDGES = "select * from int_edges__open order by started_seq"


def lookahead(setting: int | str, parallel: int, turn_seconds: float | None, pass_seconds: float | None) -> int:
    """The edges an async pass starts beyond the free slots (``RunConfig.lookahead``).

    "auto": the turns ``parallel`` slots finish in two passes of the engine, at the
    moving averages of a turn's and a pass's time (none until both were timed), at
    most ``parallel``. With turns of minutes that is one; with turns about as short
    as a pass, up to a queued turn for every slot.
    """
    if setting != "auto":
        return int(setting)
    if not turn_seconds or pass_seconds is None:
        return 0
    return min(parallel, math.ceil(2 * parallel * pass_seconds / turn_seconds))


class BackendFailingError(TeacherFailedError):
    """Turns keep failing with a backend error: the run stops, resumable after the fix."""


class RunStoppedError(TeacherFailedError):
    """The run stopped before its trees were done (a RunStopped decision: see the module doc)."""


GRADER_OUTPUT_LINES = 30  # of the grader's output, shown when its check stops the run


class Explorer:
    """Grows every tree of one run until all have stopped.

    ``on_progress`` is called after every step with a function returning the run's
    progress (the ``run_progress`` and ``run_pace`` rows); it reads the views only when
    called, so a renderer decides how often that costs a query. ``runner`` runs a
    turn (default: ``teacher.run_turn`` on a slot's thread; engine.mcts.cluster runs
    it on a Ray worker); ``teacher`` forks the roots and discards states either way.
    """

    def __init__(
        self,
        writer: LogWriter,
        catalog: Catalog,
        config: RunConfig,
        teacher: Teacher,
        on_progress: Callable[[Callable[[], Row]], None] | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.writer = writer
        self.catalog = catalog
        self.config = config
        self.teacher = teacher
        self.on_progress = on_progress
        self.spool = Spool(writer.log.dir, writer.identity) if config.schedule == "rounds" else None
        self.pool = TurnPool(teacher, config.parallel, self.spool, runner)
        self.keeper = Keeper(writer.log.data_dir, writer.log.run_id)  # the run's derived state, for its readers
        self.roots = {
            r["tree_id"]: RootInfo(r["tree_id"], r["path"], r["score"], r["commit_hash"])
            for r in catalog.query("select * from stg_root_added order by tree_id")
        }
        self.direction = catalog.query("select direction from run_config")[0]["direction"]
        self._root_states: dict[str, dict[str, Any]] = {}  # memo of the backend's root_state
        self._unpublished: list[tuple[str, int]] = []  # spooled turns staged, not yet published
        self._held = False  # a streak of backend errors is open: publishing waits
        self._pass_seconds: float | None = None  # async: a moving average of the passes' times
        self._grader_output = ""  # what the grader printed in this process's check

    # ------------------------------------------------------------------ run

    def run(self, resumed: bool = False, note: str = "resumed from the log") -> None:
        """Explore until every tree has stopped and nothing is in flight (``note``: RunResumed's)."""
        with self._unwinding():
            self.start(resumed, note)
            self.grow()
            self.finish()

    def start(self, resumed: bool = False, note: str = "resumed from the log") -> None:
        """What comes before the first turn: RunResumed (``resumed``), the grader's and the run's checks."""
        with self._unwinding():
            if resumed:
                self._stage([RunResumed(note=note, teacher_version=self.teacher.version)])
                self._check_backend()
            self._check_grader()
            self._check_run()

    def grow(self) -> None:
        """Grow the trees until no edge is open and none can start, everything published.

        In a run of a campaign's coverage policy that is when every tree has used its
        grants (or stopped): the campaign grants more and calls this again.
        """
        with self._unwinding():
            if self.config.schedule == "rounds":
                self._run_rounds()
            else:
                self._run_async()
            self._publish(force=True)  # a campaign reads the runs' tails next

    def finish(self) -> None:
        """Record the stops due, the default Top-k and supervision selections and RunFinished; clear the spool."""
        with self._unwinding():
            with self._whole():
                self._stage(decisions.stops(self._query("select * from int_trees__stopping order by tree_id")))
                weights, top_k = default_parameters(self.catalog)
                self._stage([selection_decision(self.catalog, self.writer.tail, weights, top_k)])
                self._stage([supervision_decision(self.catalog, self.writer.tail, default_rule(self.catalog))])
                self._stage([RunFinished()])
                self._publish(force=True)
            if self.spool is not None:
                self.spool.clear()
        self.pool.close()
        self.keeper.close()

    def stage_facts(self, events: list[Event]) -> None:
        """Stage and publish facts from outside the engine (a campaign's grants), whole."""
        with self._whole():
            self._stage(events)
        self._publish(force=True, keep=False)

    def cancel(self) -> None:
        """Stop the turns in flight from another thread: the engine's loop then unwinds (see :meth:`run`)."""
        self.pool.cancel.set()

    @contextlib.contextmanager
    def _unwinding(self) -> Iterator[None]:
        """An error or a signal stops the turns in flight and publishes what is whole (turns, whole steps)."""
        try:
            yield
        except BaseException as err:
            self.pool.close(cancel=True)
            if not isinstance(err, BackendFailingError):  # its failed turns stay unpublished
                self._publish_safely()
            raise

    def _run_rounds(self) -> None:
        """Batches: every free slot started, then all turn 1s, then all turn 2s, in start order."""
        edges = self._open()
        while True:
            if not edges:
                self._fill(free=self.config.parallel)
                self._publish()
                edges = self._open()
                if not edges:
                    return
            for step in TURN_STEPS:
                todo = [self._request(e) for e in edges if e["next_step"] == step]
                if todo:
                    done: list[Event] = []
                    try:
                        for request, facts in zip(todo, self.pool.gather(todo), strict=False):
                            done.extend(facts)
                            self._unpublished.append((request.edge_id, request.turn))
                    finally:
                        self._stage_turns(done + self.spool.drained())
                    self._check_backend()
                edges = self._decide()
                self._publish()
                self._report()

    def _run_async(self) -> None:
        """A freed slot is refilled at once; each pass serves every turn finished meanwhile.

        A pass submits what it can as early as it can: an edge's turn 2 right after the
        skips and verdicts (which need only the edge tables), new edges after the fill
        (which refreshes the tree state), and publishes while those turns run.
        """
        woke = None
        while True:
            edges = self._decide()
            self._submit(edges)
            if self._fill(free=self.config.parallel + self._lookahead() - len(edges)):
                self._submit(self._open())
            self._publish()
            self._report()
            if not self.pool.running:
                return
            if woke is not None:
                self._pass_seconds = moving_average(self._pass_seconds, time.monotonic() - woke)
            finished = self.pool.wait()
            woke = time.monotonic()
            self._stage_turns([fact for _request, facts in finished for fact in facts])
            self._check_backend()

    def _lookahead(self) -> int:
        return lookahead(self.config.lookahead, self.config.parallel, self.pool.turn_seconds, self._pass_seconds)

    def _submit(self, edges: list[Row]) -> None:
        """Start the turn each open edge needs, unless it runs already (async)."""
        for edge in edges:
            step = TURN_STEPS.get(edge["next_step"])
            if step and (edge["edge_id"], step) not in self.pool.running:
                self.pool.submit(self._request(edge))

    # ------------------------------------------------------------ decisions

    @contextlib.contextmanager
    def _whole(self) -> Iterator[None]:
        """A step of decisions staged whole or not at all: a signal or an error inside it
        unstages what it staged, so the unwinding publishes the turns and the whole steps
        before it, never half a fill (a resumed rounds run would start a smaller batch)."""
        mark = self.writer.mark()
        try:
            yield
        except BaseException:
            self.writer.unstage(mark)
            raise

    def _decide(self) -> list[Row]:
        """Record each skip of turn 2 that is due, then each verdict; return the open edges left."""
        with self._whole():
            edges, judged = self._decide_now()
        if judged:  # a stop of the run is due after verdicts: a whole step of its own, published
            self._check_run()
        return edges

    def _decide_now(self) -> tuple[list[Row], bool]:
        edges = self._open()
        skips = decisions.skips(edges, self.writer.tail)
        if skips:  # a recorded skip makes its edge due for a verdict
            self._stage(skips)
            edges = self._open()
        judged = decisions.verdicts(edges, self.writer.tail)
        if not judged:
            return edges, False
        self._stage(judged)
        for edge in edges:  # a pruned or retried edge's checkpoints are never forked again
            if edge["next_step"] == "judge" and edge["verdict"] in ("pruned", "retry"):
                for state in (edge["turn1_state"], edge["end_state"]):
                    if state:
                        self.teacher.discard(json.loads(state))
        return self._open(), True

    def _fill(self, free: int) -> int:
        """Record the stops due, then start an edge for each of ``free`` slots, round-robin (ALGORITHM §2).

        Returns the number of edges started.
        """
        with self._whole():
            return self._fill_now(free)

    def _fill_now(self, free: int) -> int:
        self._stage(decisions.stops(self._query("select * from int_trees__stopping order by tree_id")))
        if free <= 0:
            return 0
        order = [r["tree_id"] for r in self._query("select tree_id from int_rotation order by visit")]
        robin = decisions.RoundRobin(order, self._work(), free)
        started = 0
        while (step := robin.next()) is not None:
            if isinstance(step, set):
                robin.update(self._work(step))
            else:
                self._stage(decisions.start(step))
                started += 1
                crash_point("edge.started")
        return started

    def _check_backend(self) -> None:
        """After turns are staged: stop when the streak of backend errors reaches the limit.

        While the streak is open, publishing waits (only turn facts change it).
        """
        row = self._query("select streak, turns, last_error from int_turns__failing")[0]
        self._held = row["streak"] > 0
        if row["streak"] >= self.config.backend_error_limit:
            lost = f" ({row['streak']} failures: a lost server counts once)" if row["turns"] > row["streak"] else ""
            msg = (
                f"the last {row['turns']} turns failed with a backend error{lost}, the last one: "
                f"{row['last_error']} - nothing of them was recorded; fix the cause and continue "
                f"with '{self._resume_hint()}'"
            )
            raise BackendFailingError(msg)

    def _check_grader(self) -> None:
        """Before the first turn: the backend grades the first root's own code (GraderChecked).

        Not again once a check passed (a resume of a run whose check failed checks again).
        """
        check = getattr(self.teacher, "check_grader", None)
        if check is None:
            return
        last = self._query("select outcome from int_grader_checks order by seq desc limit 1")
        if last and last[0]["outcome"] == "passed":
            return
        root = next((r for _, r in sorted(self.roots.items()) if r.score is not None), None)
        fact = check(root, self._root_state(root.tree_id)) if root else None
        if fact is not None:
            self._stage([fact])
            log, feedback = fact.grader_log or "", fact.feedback or ""
            self._grader_output = log if feedback.strip() in log else f"{log}\n{feedback}"

    def _check_run(self) -> None:
        """Record the stop of the run that is due (int_run__stopping), and end with its error."""
        due = self._query("select reason, error from int_run__stopping order by reason")
        if not due:
            return
        reason, error = due[0]["reason"], due[0]["error"]
        self._stage([RunStopped(watermark=self.writer.tail, reason=reason, error=error)])
        hint = self._resume_hint()
        if reason == "grader_check":
            shown = "\n".join(self._grader_output.strip().splitlines()[-GRADER_OUTPUT_LINES:])
            raise RunStoppedError(
                f"the grader check before the first turn failed: {error}. The grader printed:\n{shown}\n"
                "Is --coral-dir the Student run of this task? Start a new run with the right one; or fix the "
                f"grader and continue with '{hint}'; or skip the check with "
                "--no-grader-check (backend_options.grader_check = false)"
            )
        raise RunStoppedError(
            f"{error} - the grader cannot grade this task's code (another task's grader? one missing "
            f"something?); the run stopped, its turns recorded: fix the cause and continue with '{hint}'"
        )

    def _resume_hint(self) -> str:
        """The command that continues this run: its campaign's resume when a campaign grants its trees."""
        log = self.writer.log
        if self.config.grants is not None:
            return command_line(log.data_dir, "campaign", "--resume", self.config.grants.campaign)
        return command_line(log.data_dir, "explore", "--resume", log.run_id)

    # ----------------------------------------------------------------- views

    def _query(self, sql: str, params: list[Any] | None = None) -> list[Row]:
        return self.catalog.query(sql, params)

    def _open(self) -> list[Row]:
        return self._query(OPEN_EDGES)

    def _work(self, trees: set[str] | None = None) -> dict[str, list[Row]]:
        """Each tree's starts due, in pick order (every tree, or those given)."""
        if trees is None:
            rows = self._query("select * from int_next_work order by tree_id, pick")
        else:
            rows = self._query(
                "select * from int_next_work where tree_id in (select unnest(?)) order by tree_id, pick",
                [sorted(trees)],
            )
        work: dict[str, list[Row]] = {}
        for row in rows:
            work.setdefault(row["tree_id"], []).append(row)
        return work

    # ---------------------------------------------------------------- turns

    def _request(self, edge: Row) -> TurnRequest:
        """The turn an ``int_edges__open`` row needs next."""
        turn = TURN_STEPS[edge["next_step"]]
        if turn == 2:
            start = json.loads(edge["turn1_state"]) if edge["turn1_state"] else {}
        elif edge["parent_id"] == edge["tree_id"]:
            start = self._root_state(edge["tree_id"])
        else:
            start = json.loads(edge["parent_state"]) if edge["parent_state"] else {}
        return TurnRequest(
            tree_id=edge["tree_id"],
            edge_id=edge["edge_id"],
            parent_id=edge["parent_id"],
            turn=turn,
            slot=edge["slot"],
            attempt=edge["attempt"],
            start_state=start,
            fork=turn == 1,
            direction=self.direction,
            timeout_s=self.config.backend_options.get("turn_timeout_s"),
        )

    def _root_state(self, tree_id: str) -> dict[str, Any]:
        if tree_id not in self._root_states:
            self._root_states[tree_id] = self.teacher.root_state(self.roots[tree_id])
        return self._root_states[tree_id]

    # ------------------------------------------------------------- recording

    def _stage(self, events: list[Event]) -> None:
        self.catalog.insert(self.writer.stage(events))

    def _stage_turns(self, facts: list[Event]) -> None:
        """Stage turn facts, each content once per run: a ContentRecorded whose id the log
        (or an earlier fact here) holds already is left out (the turns of an edge share
        their system prompt, and every turn of a run its tool list)."""
        ids = sorted({f.content_id for f in facts if isinstance(f, ContentRecorded)})
        seen = (
            {
                r["content_id"]
                for r in self._query(
                    "select content_id from stg_content_recorded where content_id in (select unnest(?))",
                    [ids],
                )
            }
            if ids
            else set()
        )
        kept = []
        for fact in facts:
            if isinstance(fact, ContentRecorded):
                if fact.content_id in seen:
                    continue
                seen.add(fact.content_id)
            kept.append(fact)
        self._stage(kept)

    def _publish(self, force: bool = False, keep: bool | None = None) -> None:
        """Flush what is staged, unless a streak of backend errors is open (see the module doc), and tell the
        run's keeper; ``keep``: keep the derived state whatever the keeper's rules say (default: ``force``)."""
        if self._held and not force:
            return
        keep = force if keep is None else keep
        self.keeper.publishing(keep)
        self.writer.flush()
        self.keeper.published(self.catalog, force=keep)
        if self.spool is not None:
            for edge_id, turn in self._unpublished:
                self.spool.drop(edge_id, turn)
        self._unpublished = []

    def _publish_safely(self) -> None:
        with contextlib.suppress(Exception):  # the original error matters more
            self._publish()

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self._progress)

    def _progress(self) -> Row:
        return self._query("select * from run_progress")[0] | self._query("select * from run_pace")[0]
