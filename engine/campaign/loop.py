"""A campaign's loop over its tasks' runs: open (or create) them, grow them at once in shared slots, decide rounds.

See engine/campaign/__init__.py for the order of the steps and why a kill -9 cannot break it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.campaign.config import CampaignConfig, TaskSpec
from engine.campaign.log import stop_reason, task_run_id
from engine.campaign.policy import Round, TaskRows, decide, spent
from engine.catalog import Catalog
from engine.config import RunConfig
from engine.exploration import PlannedRun, plan_run, ray_executor
from engine.mcts.explorer import Explorer
from engine.render import counted, spend_line
from engine.roots import DirectionConflict
from engine.runs import growing, run_finished
from engine.runset import campaign_tasks
from engine.teachers import Teacher, TurnCancelled, TurnRequest, check_memory, make_teacher, turn_memory_mb
from ingest.events import BlockGranted, BudgetAllocated, CampaignStopped, Event, GrantsClosed, RunFinished
from ingest.faults import crash_point
from ingest.log import EventLog, LogWriter

WAIT_S = 0.2  # how often a turn waiting for a shared slot (or the campaign, for its runs) looks up
Report = Callable[[str], None]


# ------------------------------------------------------------------ slots


class SharedSlots:
    """``parallel`` slots for the turns of every run of a campaign: a turn waits for a free one."""

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel
        self._free = threading.Semaphore(parallel)

    def runner(self, run: Callable[[TurnRequest, threading.Event], list[Event]]) -> Callable:
        def in_a_slot(request: TurnRequest, cancel: threading.Event) -> list[Event]:
            while not self._free.acquire(timeout=WAIT_S):
                if cancel.is_set():
                    raise TurnCancelled(f"{request.edge_id} turn {request.turn}: cancelled")
            try:
                return run(request, cancel)
            finally:
                self._free.release()

        return in_a_slot


# ------------------------------------------------------------------- runs


@dataclass
class TaskRun:
    """One task's run, open for writing while the campaign goes on."""

    task: str
    run_id: str
    writer: LogWriter
    catalog: Catalog
    config: RunConfig
    teacher: Teacher | None
    resumed: bool
    finished: bool
    explorer: Explorer | None = None
    cluster: Any = None

    def rows(self) -> TaskRows:
        gains = self.catalog.query("select * from campaign_gains order by tree_id")
        spend = self.catalog.query("select * from campaign_spend")[0]
        return TaskRows(self.task, self.run_id, gains, spend)


def drive(
    data_dir: Path,
    name: str,
    writer: LogWriter,
    catalog: Catalog,
    config: CampaignConfig,
    *,
    executor: str,
    ray_address: str | None,
    report: Report,
    plans: dict[str, PlannedRun] | None = None,
) -> None:
    """Open (or create: from ``plans``, else planned now) every task's run, then run the policy's loop."""
    plans = dict(plans or {})
    rows = campaign_tasks(catalog)
    slots = SharedSlots(config.parallel)
    with contextlib.ExitStack() as stack:
        runs = []
        for r in rows:
            if r["task"] not in plans and not EventLog(data_dir, r["task_run"]).exists():
                plans[r["task"]] = plan_task(data_dir, name, config, config.task(r["task"]))
            runs.append(stack.enter_context(_opened(data_dir, r["task"], r["task_run"], plans.get(r["task"]))))
        for run in runs:
            said = f"task {run.task}, {run.config.direction}"
            report(f"{'resumed' if run.resumed else 'created'} run {run.run_id} ({said})")
        live = [r for r in runs if not r.finished]
        _attach(live, slots, executor, ray_address, stack)
        for run in live:
            run.explorer.start(resumed=run.resumed)  # type: ignore[union-attr]
        campaign = _Campaign(name, writer, catalog, config, runs, report)
        if config.policy == "fixed":
            campaign.fixed()
        else:
            campaign.coverage()


def plan_task(data_dir: Path, name: str, config: CampaignConfig, spec: TaskSpec) -> PlannedRun:
    """A task's new run, planned and checked (its snapshots selected), nothing written.

    A source whose snapshots a selection copied keeps the direction it recorded: a task's
    ``direction`` (or [explore]'s) that disagrees is refused.
    """
    try:
        return plan_run(
            data_dir, Path(spec.source), config.run_config(spec, name), task_run_id(name, spec.name), select=True
        )
    except DirectionConflict as err:
        raise err.said_as(f"task {spec.name!r}: its direction") from err


@contextlib.contextmanager
def _opened(data_dir: Path, task: str, run_id: str, plan: PlannedRun | None) -> Iterator[TaskRun]:
    """A task's run, open for writing: the one its log holds, else created now from ``plan``."""
    if plan is None:
        with (
            growing(data_dir, run_id) as (writer, run_catalog, run_config, finished),
            _engine(TaskRun(task, run_id, writer, run_catalog, run_config, None, True, finished)) as run,
        ):
            yield run
        return
    plan.copy_roots()
    teacher = make_teacher(plan.config, EventLog(data_dir, run_id).dir)  # its version starts the log
    try:
        with LogWriter.create(data_dir, run_id) as writer:
            run_catalog = plan.begin(writer, teacher.version)
            made, teacher = TaskRun(task, run_id, writer, run_catalog, plan.config, teacher, False, False), None
            with _engine(made) as run:
                yield run
    finally:
        if teacher is not None:  # (not handed to the run: it failed before)
            teacher.close()


@contextlib.contextmanager
def _engine(run: TaskRun) -> Iterator[TaskRun]:
    """The run with its Teacher (when it is not finished), closed with its cluster on the way out."""
    if not run.finished and run.teacher is None:
        run.teacher = make_teacher(run.config, run.writer.log.dir)
    try:
        yield run
    finally:
        if run.cluster is not None:
            run.cluster.close()
        if run.teacher is not None:
            run.teacher.close()


def _attach(live: list[TaskRun], slots: SharedSlots, executor: str, ray_address: str | None, stack: Any) -> None:
    """Give every live run its engine, its turns run in the campaign's shared slots."""
    if executor == "local" and live:  # the campaign's slots take turns of any of its runs
        check_memory(max(turn_memory_mb(r.config) for r in live), slots.parallel)
    needed = sum(r.config.parallel for r in live)  # (on Ray, the first run's executor joins with every run's)
    for run in live:
        run.cluster = ray_executor(executor, run.config, run.writer.log.dir, ray_address, needed)
        turn = run.cluster.run_turn if run.cluster else run.teacher.run_turn
        run.explorer = Explorer(run.writer, run.catalog, run.config, run.teacher, None, slots.runner(turn))


class _Campaign:
    """The campaign's loop over its open runs (see the module doc)."""

    def __init__(
        self,
        name: str,
        writer: LogWriter,
        catalog: Catalog,
        config: CampaignConfig,
        runs: list[TaskRun],
        report: Report,
    ) -> None:
        self.name = name
        self.writer = writer
        self.catalog = catalog
        self.config = config
        self.runs = runs
        self.report = report

    # -- policies

    def fixed(self) -> None:
        """Every run grows by its own rules, at once, and finishes."""
        self._at_once(lambda e: (e.grow(), e.finish()))
        self._stop_and_finish()

    def coverage(self) -> None:
        """Rounds of blocks until the campaign stops, then every run's grants closed and the runs finished."""
        while True:
            self._copy()
            state = self.catalog.query("select * from campaign_state")[0]
            if state["stop_reason"] is not None:
                break
            self._at_once(lambda e: e.grow())
            round_no = 0 if state["last_round"] is None else state["last_round"] + 1
            rows = [run.rows() for run in self.runs]
            marks = {run.run_id: run.writer.tail for run in self.runs}
            decided = decide(self.config, round_no, rows)
            self._record(round_no, marks, decided, rows)
        self._at_once(lambda e: (e.grow(), e.finish()))
        self._stop_and_finish()

    # -- steps

    def _record(self, round_no: int, marks: dict[str, int], decided: Round, rows: list[TaskRows]) -> None:
        if decided.stop is not None:
            event: Event = CampaignStopped(watermark=self.writer.tail, round=round_no, marks=marks, reason=decided.stop)
        else:
            event = BudgetAllocated(
                watermark=self.writer.tail, round=round_no, rule=decided.rule, marks=marks, grants=decided.grants
            )
        self.catalog.insert(self.writer.stage([event]))
        self.writer.flush()
        crash_point("campaign.decided")
        if decided.stop is not None:
            what = f"stop ({decided.stop})"
        else:
            tasks = counted(len({g["task"] for g in decided.grants}), "task")
            what = f"({decided.rule}) a block to each of {counted(len(decided.grants), 'tree')} of {tasks}"
        budget = self.config.budget
        self.report(
            f"round {round_no} {what}; {spend_line(*spent([t.spend for t in rows]), budget.edges, budget.tokens)}"
        )

    def _copy(self) -> None:
        """Stage in every run what the campaign recorded for it and the run does not hold yet: its
        grants (BlockGranted), and after the stop GrantsClosed. Idempotent: a resume copies what a kill left."""
        grants = self.catalog.query(
            "select round, task_run, tree_id, edges from campaign_grants order by seq, task_run, tree_id"
        )
        stop = stop_reason(self.catalog)
        for run in self.runs:
            if run.finished:
                continue
            held = {
                (r["round"], r["tree_id"]) for r in run.catalog.query("select round, tree_id from stg_block_granted")
            }
            facts: list[Event] = [
                BlockGranted(tree_id=g["tree_id"], edges=g["edges"], round=g["round"])
                for g in grants
                if g["task_run"] == run.run_id and (g["round"], g["tree_id"]) not in held
            ]
            if stop is not None and not run.catalog.query("select 1 from stg_grants_closed"):
                facts.append(GrantsClosed(reason=stop))
            if facts:
                run.explorer.stage_facts(facts)  # type: ignore[union-attr]

    def _stop_and_finish(self) -> None:
        """The campaign's stop (when not recorded: the fixed policy's, every tree stopped) and RunFinished."""
        if stop_reason(self.catalog) is None:
            marks = {run.run_id: run.writer.tail for run in self.runs}
            self.catalog.insert(
                self.writer.stage(
                    [CampaignStopped(watermark=self.writer.tail, round=0, marks=marks, reason="trees_stopped")]
                )
            )
        self.catalog.insert(self.writer.stage([RunFinished()]))
        self.writer.flush()

    def _at_once(self, step: Callable[[Explorer], Any]) -> None:
        """``step`` on every unfinished run's engine, each in a thread of its own; the first error is raised.

        A signal (raised in this thread) or a run's error cancels the others' turns: each
        engine then unwinds as an interrupted ``explore`` does, publishing what is whole.
        """
        live = [run for run in self.runs if not run.finished]
        errors: list[BaseException] = []

        def work(run: TaskRun) -> None:
            try:
                step(run.explorer)  # type: ignore[arg-type]
            except BaseException as err:  # handed to the campaign's thread
                errors.append(err)
                for other in live:
                    other.explorer.cancel()  # type: ignore[union-attr]

        threads = [threading.Thread(target=work, args=(run,), name=f"campaign-{run.task}") for run in live]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(WAIT_S)
        except BaseException:
            for run in live:
                run.explorer.cancel()  # type: ignore[union-attr]
            for thread in threads:
                thread.join()
            raise
        if errors:
            first = next((e for e in errors if not isinstance(e, TurnCancelled)), errors[0])
            raise first
        for run in live:
            if run_finished(run.catalog):
                run.finished = True
