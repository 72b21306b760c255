"""Campaigns (``campaign CAMPAIGN.toml``): many tasks, one budget, spent where it adds independent supervision.

A campaign is a log of its own, ``<data>/campaigns/runs/<name>/log`` (the same writer
and guarantees as a run's), and one exploration run per task, ``<name>-<task>``, under
``<data>/runs`` as any other. Its log holds its config (``RunStarted``, command
``campaign``), its tasks (``CampaignTaskAdded``) and its decisions: each round's
blocks of budget (``BudgetAllocated``) and its stop (``CampaignStopped``). A run of
the ``coverage`` policy records each block it was given as a fact (``BlockGranted``)
and the end of its grants (``GrantsClosed``), so the run's own views (and replay)
see every bound its trees grew under::

    record the tasks; create (or open) every task's run
    fixed:    grow every run by its own rules, at once, to the end
    coverage: until the campaign stops:
                  copy every recorded grant into its run
                  grow every run, at once, until each tree has used its grants
                  read every run's campaign_gains and campaign_spend at its tail
                  record the round's grants (policy.decide), or the stop
              close every run's grants; grow and finish every run

The runs share ``parallel`` slots: a turn of any task waits for a free one. Each
run keeps its own ``parallel`` (its batch in rounds mode, a decision parameter), so
a run of a campaign grows as a separate ``explore`` of it would. Every step is in a
log before the next one reads it, in an order a kill -9 cannot break:
``campaign --resume`` copies what a round recorded and its runs did not, resumes
every run, and goes on; in rounds mode it reaches the same campaign.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import __version__
from engine.campaign.config import CampaignConfig, TaskSpec, load_campaign
from engine.campaign.names import campaigns_dir
from engine.campaign.policy import Round, TaskRows, decide
from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from engine.config import RunConfig
from engine.exploration import ENGINE_THREADS, plan_run
from engine.mcts.explorer import Explorer
from engine.runs import recorded_config
from engine.teachers import Teacher, TurnCancelled, TurnRequest, make_teacher
from ingest.errors import InputError, LogError
from ingest.events import (
    BlockGranted,
    BudgetAllocated,
    CampaignStopped,
    CampaignTaskAdded,
    Event,
    GrantsClosed,
    RunFinished,
    RunResumed,
    RunStarted,
)
from ingest.log import EventLog, LogWriter, check_run_id

CAMPAIGN_VIEWS = VIEWS_DIR / "campaign"
POLICIES = ("fixed", "coverage")
WAIT_S = 0.2  # how often a turn waiting for a shared slot looks at its cancel flag
Report = Callable[[str], None]


def campaign_log(data_dir: Path, name: str) -> EventLog:
    """The log of campaign ``name`` (LogError names it when it does not exist, on ``require``)."""
    return EventLog(campaigns_dir(data_dir), name)


def campaign_names(data_dir: Path) -> list[str]:
    """The campaigns under ``<data>/campaigns``, by name."""
    from ingest.listing import run_ids

    return run_ids(campaigns_dir(data_dir))


def task_run_id(campaign: str, task: str) -> str:
    return check_run_id(f"{campaign}-{task}")


def open_campaign(data_dir: Path, name: str) -> Catalog:
    """A catalog of the campaign's log (views/campaign); LogError when there is no such campaign."""
    log = campaign_log(data_dir, name)
    if not log.exists():
        raise LogError(f"campaign {name!r} not found under {campaigns_dir(data_dir)}")
    catalog = Catalog.empty(CAMPAIGN_VIEWS, threads=ENGINE_THREADS)
    catalog.load(log)
    return catalog


def recorded_campaign(catalog: Catalog, name: str) -> CampaignConfig:
    """The configuration a campaign's log records (LogError when it is not one this version accepts)."""
    import json

    from pydantic import ValidationError

    rows = catalog.query("select config_json from campaign_config")
    if not rows:
        raise LogError(f"campaign {name!r}: its log records no configuration")
    try:
        return CampaignConfig.model_validate(json.loads(rows[0]["config_json"]))
    except (ValidationError, ValueError) as err:
        raise LogError(f"campaign {name!r}: its recorded configuration is not valid ({err})") from err


def campaign_runs(data_dir: Path, name: str) -> list[str]:
    """The runs of campaign ``name``, in its tasks' order (those created so far)."""
    catalog = open_campaign(data_dir, name)
    runs = [r["task_run"] for r in catalog.query("select task_run from campaign_tasks order by task_order")]
    return [r for r in runs if EventLog(data_dir, r).exists()]


# ------------------------------------------------------------------ slots


class SharedSlots:
    """``parallel`` slots for the turns of every run of a campaign: a turn waits for a free one."""

    def __init__(self, parallel: int) -> None:
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


@dataclass
class CampaignResult:
    """What a campaign holds: its name, policy, whether it was resumed, its runs and totals."""

    name: str
    policy: str
    resumed: bool
    runs: list[str]
    rounds: int
    stop_reason: str | None
    summary: list[dict[str, Any]] = field(default_factory=list)


def new_campaign(
    data_dir: Path,
    path: Path,
    name: str | None = None,
    parallel: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    report: Report | None = None,
) -> CampaignResult:
    """Run the campaign of the TOML file ``path`` to the end (``name``: its log's; default the file's stem)."""
    config = load_campaign(path, parallel)
    name = check_run_id(name or Path(path).stem)
    if campaign_log(data_dir, name).exists():
        raise InputError(f"campaign {name!r} already exists - choose another --name or --resume it")
    taken = [r for t in config.tasks if EventLog(data_dir, r := task_run_id(name, t.name)).exists()]
    if taken:
        raise InputError(
            f"campaign {name!r}: its runs' ids are taken already ({', '.join(taken)}) - choose another --name"
        )
    with LogWriter.create(campaigns_dir(data_dir), name) as writer:
        started = RunStarted(command="campaign", config=config.model_dump(mode="json"), tool_version=__version__)
        tasks = [
            CampaignTaskAdded(task=t.name, task_run=task_run_id(name, t.name), source=t.source) for t in config.tasks
        ]
        writer.stage([started, *tasks])
        writer.flush()
        catalog = Catalog.empty(CAMPAIGN_VIEWS, threads=ENGINE_THREADS)
        catalog.load(campaign_log(data_dir, name))
        _drive(data_dir, name, writer, catalog, config, executor, ray_address, report or (lambda _: None))
    return campaign_result(data_dir, name, resumed=False)


def resume_campaign(
    data_dir: Path,
    name: str,
    parallel: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    report: Report | None = None,
) -> CampaignResult:
    """Continue an interrupted campaign from its log (``parallel``: the shared slots from now on)."""
    catalog = open_campaign(data_dir, name)
    config = recorded_campaign(catalog, name)
    finished = catalog.query("select finished from campaign_state")[0]["finished"]
    if not finished:
        with LogWriter.open(campaigns_dir(data_dir), name) as writer:
            note = "resumed from the log" + (f"; parallel {parallel} (recorded {config.parallel})" if parallel else "")
            writer.stage([RunResumed(note=note)])
            writer.flush()
            if parallel is not None:
                config = config.model_copy(update={"parallel": parallel})
            catalog.load(campaign_log(data_dir, name))
            _drive(data_dir, name, writer, catalog, config, executor, ray_address, report or (lambda _: None))
    return campaign_result(data_dir, name, resumed=not finished)


def _drive(
    data_dir: Path,
    name: str,
    writer: LogWriter,
    catalog: Catalog,
    config: CampaignConfig,
    executor: str,
    ray_address: str | None,
    report: Report,
) -> None:
    specs = {t.name: t for t in config.tasks}
    rows = catalog.query("select task, task_run from campaign_tasks order by task_order")
    slots = SharedSlots(config.parallel)
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(_opened(data_dir, name, r["task"], r["task_run"], specs, config)) for r in rows]
        for run in runs:
            report(f"{'resumed' if run.resumed else 'created'} run {run.run_id} (task {run.task})")
        live = [r for r in runs if not r.finished]
        _attach(live, slots, executor, ray_address, stack)
        for run in live:
            run.explorer.start(resumed=run.resumed)  # type: ignore[union-attr]
        campaign = _Campaign(name, writer, catalog, config, runs, report)
        if config.policy == "fixed":
            campaign.fixed()
        else:
            campaign.coverage()


@contextlib.contextmanager
def _opened(
    data_dir: Path, name: str, task: str, run_id: str, specs: dict[str, TaskSpec], config: CampaignConfig
) -> Iterator[TaskRun]:
    """A task's run, open for writing: the one its log holds, else created now."""
    log = EventLog(data_dir, run_id)
    if log.exists():
        with LogWriter.open(data_dir, run_id) as writer:
            run_catalog = Catalog.for_log(log, threads=ENGINE_THREADS)
            run_config = recorded_config(run_catalog, log)
            finished = run_catalog.query("select count(*) as n from stg_run_finished")[0]["n"] > 0
            with _engine(TaskRun(task, run_id, writer, run_catalog, run_config, None, True, finished)) as run:
                yield run
        return
    spec = specs[task]
    plan = plan_run(data_dir, Path(spec.source), config.run_config(spec, name), run_id, select=True)
    plan.copy_roots()
    with LogWriter.create(data_dir, run_id) as writer:
        run_catalog = plan.begin(writer)
        with _engine(TaskRun(task, run_id, writer, run_catalog, plan.config, None, False, False)) as run:
            yield run


@contextlib.contextmanager
def _engine(run: TaskRun) -> Iterator[TaskRun]:
    """The run with its Teacher (when it is not finished), closed with its cluster on the way out."""
    if not run.finished:
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
    from engine.exploration import EXECUTORS

    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r} (use {' or '.join(EXECUTORS)})")
    for run in live:
        turn = run.teacher.run_turn
        if executor == "ray":
            from engine.mcts.cluster import RayExecutor

            run.cluster = RayExecutor(run.config, run.writer.log.dir, ray_address, shared=True)
            turn = run.cluster.run_turn
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
        spent = sum(int(t.spend["kept_edges"]) for t in rows)
        tokens = sum(int(t.spend["tokens"]) for t in rows)
        budget = self.config.budget
        of = f"/{budget.edges}" if budget.edges else ""
        of_tokens = f"/{budget.tokens / 1e6:.1f}M" if budget.tokens else ""
        if decided.stop is not None:
            spent_line = f"spent {spent}{of} valid edges, {tokens / 1e6:.1f}M{of_tokens} tokens"
            self.report(f"round {round_no}: stop ({decided.stop}); {spent_line}")
        else:
            trees = len(decided.grants)
            tasks = len({g["task"] for g in decided.grants})
            self.report(
                f"round {round_no} ({decided.rule}): {trees} blocks to {trees} trees of {tasks} tasks; "
                f"spent {spent}{of} valid edges, {tokens / 1e6:.1f}M{of_tokens} tokens"
            )

    def _copy(self) -> None:
        """Stage in every run what the campaign recorded for it and the run does not hold yet: its
        grants (BlockGranted), and after the stop GrantsClosed. Idempotent: a resume copies what a kill left."""
        grants = self.catalog.query(
            "select round, task_run, tree_id, edges from campaign_grants order by seq, task_run, tree_id"
        )
        stop = self.catalog.query("select reason from campaign_rounds where rule = 'stop'")
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
            if stop and not run.catalog.query("select 1 from stg_grants_closed"):
                facts.append(GrantsClosed(reason=stop[0]["reason"]))
            if facts:
                run.explorer.stage_facts(facts)  # type: ignore[union-attr]

    def _stop_and_finish(self) -> None:
        """The campaign's stop (when not recorded: the fixed policy's, every tree stopped) and RunFinished."""
        if not self.catalog.query("select 1 from campaign_rounds where rule = 'stop'"):
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
            if run.catalog.query("select count(*) as n from stg_run_finished")[0]["n"] > 0:
                run.finished = True


# ---------------------------------------------------------------- reading


def campaign_result(data_dir: Path, name: str, resumed: bool) -> CampaignResult:
    """The campaign's state and its summary (per task and in total), read from the logs."""
    catalog = open_campaign(data_dir, name)
    config = recorded_campaign(catalog, name)
    state = catalog.query("select * from campaign_state")[0]
    runs = campaign_runs(data_dir, name)
    return CampaignResult(
        name, config.policy, resumed, runs, state["rounds"], state["stop_reason"], summary(data_dir, runs)
    )


SUMMARY = """
select
    s.run_id,
    s.stratum_key as task,
    s.selected_paths as n,
    s.n_eff,
    s.n_eff_ratio,
    s.roots,
    (select count(*) from coverage as g where g.run_id = s.run_id and g.stratum = 'stage' and g.selected_paths > 0)
        as stages_covered,
    (select count(*) from coverage as g where g.run_id = s.run_id and g.stratum = 'stage') as stages,
    p.kept_edges,
    p.tokens
from coverage as s
inner join campaign_spend as p on p.run_id = s.run_id
where s.stratum = 'task'
order by s.run_id
"""


def summary(data_dir: Path, runs: list[str]) -> list[dict[str, Any]]:
    """Per task's run: N (selected paths), N_eff, N_eff/N, roots, stages covered, valid edges and tokens."""
    if not runs:
        return []
    from engine.collection import Collection

    return Collection(data_dir, runs).query(SUMMARY)
