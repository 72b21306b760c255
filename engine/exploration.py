"""Exploration runs (``explore``): create one over a set of roots, or resume one, and summarize it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.catalog import DECISION_THREADS, Catalog
from engine.config import RunConfig, parallel_problem
from engine.mcts.explorer import Explorer
from engine.mcts.spool import Spool
from engine.roots import (
    Selection,
    copy_snapshots,
    default_run_id,
    is_attempt,
    picked_detail,
    plan_selection,
    run_started,
    task_direction,
)
from engine.runs import growing
from engine.runset import Reader
from engine.supervision import default_rule, supervision_counts
from engine.teachers import Teacher, check_memory, make_teacher, turn_memory_mb
from ingest.errors import InputError, LogError, OptionError
from ingest.events import RootAdded, SnapshotsPicked
from ingest.log import EventLog, LogWriter, check_run_id
from ingest.names import RUN, claimed, refuse_clashes
from ingest.paths import command_line
from ingest.snapshots import read_snapshot, root_problem

if TYPE_CHECKING:
    from engine.mcts.cluster import RayExecutor

Progress = Callable[[Callable[[], dict[str, Any]]], None]


@dataclass
class ExploreResult:
    """What an exploration run holds: its trees (the ``trees`` view) and totals (``run_progress``)."""

    run_id: str
    resumed: bool
    trees: list[dict[str, Any]]
    progress: dict[str, Any]
    top_k: int
    supervision: list[dict[str, Any]] = field(default_factory=list)  # the default rule's supervision_counts rows


def _tree_id(i: int, n: int) -> str:
    return f"T{i:0{max(3, len(str(n)))}d}"


def _text(meta: dict[str, Any], key: str) -> str | None:
    return meta[key] if isinstance(meta.get(key), str) else None


def roots_from_dir(
    roots_dir: Path, task: str | None, direction: str | None = None, data_dir: Path | None = None
) -> tuple[list[RootAdded], str, str]:
    """RootAdded facts for every snapshot folder of a ``select-snapshots`` output.

    Folders are ordered by (global index, name); each needs a numeric score (its
    attempt JSON, as for selection). ``stage``, ``selection_reason`` and ``task``
    come from the copied ``metadata.json``. Returns the roots, the task (the one the
    roots record; ``task`` must agree with it, and is needed when they record none)
    and the direction: the one the roots were selected for (``direction`` must agree
    with it), else ``direction``, else the snapshots' CORAL config, else maximize
    (:func:`engine.roots.task_direction`; ``data_dir``: where their selection run may be).
    """
    roots_dir = Path(roots_dir)
    if not roots_dir.is_dir():
        raise InputError(f"{roots_dir}: not a directory")
    facts = [read_snapshot(p.resolve(), task or "") for p in sorted(roots_dir.iterdir())]
    problems = [f"{f.snapshot}: {f.skip_reason}" for f in facts if f.skip_reason]
    problems += [
        f"{f.snapshot}: no numeric score ({f.score_problem})" for f in facts if not f.skip_reason and f.score is None
    ]
    meta_of = {f.snapshot: json.loads((Path(f.path) / "metadata.json").read_text()) for f in facts if not f.skip_reason}
    problems += [
        f"{f.snapshot}: {problem}"
        for f in facts
        if f.snapshot in meta_of
        if (problem := root_problem(f, meta_of[f.snapshot]))
    ]
    if problems:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        raise InputError(f"{roots_dir}: cannot use every folder as a root: {shown}")
    if not facts:
        raise InputError(f"{roots_dir}: no snapshot folders to explore from")
    facts.sort(key=lambda f: (f.global_index, f.snapshot))
    metas = [meta_of[f.snapshot] for f in facts]
    task = _roots_task(roots_dir, [_text(m, "task") for m in metas], task)
    roots = [
        RootAdded(
            tree_id=_tree_id(i, len(facts)),
            task=task,
            snapshot=f.snapshot,
            path=f.path,
            global_index=f.global_index,
            agent_id=f.agent_id,
            commit_hash=f.commit_hash,
            score=f.score,
            stage=_text(meta, "stage"),
            selection_reason=_text(meta, "selection_reason"),
        )
        for i, (f, meta) in enumerate(zip(facts, metas, strict=True), start=1)
    ]
    return roots, task, task_direction(roots_dir, facts, meta_of, direction, data_dir)


def _roots_task(roots_dir: Path, recorded: list[str | None], given: str | None) -> str:
    """The task the roots record, checked against ``--task``."""
    tasks = sorted({t for t in recorded if t is not None})
    if len(tasks) > 1:
        raise InputError(
            f"{roots_dir}: the roots record several tasks ({', '.join(tasks)}) - "
            "explore the roots of one task at a time"
        )
    if tasks and given and given != tasks[0]:
        raise InputError(
            f"--task {given!r} disagrees with the task {tasks[0]!r} that the roots in "
            f"{roots_dir} were selected for - drop --task, or give {tasks[0]!r}"
        )
    if not tasks and not given:
        raise InputError(
            f"{roots_dir}: the roots record no task (they were not made by select-snapshots) - give it with --task"
        )
    return tasks[0] if tasks else given  # type: ignore[return-value]


def _roots_from_selection(
    picks: list[dict[str, Any]], task: str, roots_dir: Path
) -> tuple[list[RootAdded], Path | None]:
    """The picks as roots: their own folders, or (when a pick is a CORAL attempt) the folders they are
    to be written to in ``roots_dir``; and where they are to be written (None: nowhere)."""
    written_to = roots_dir if any(is_attempt(p) for p in picks) else None
    roots = [
        RootAdded(
            tree_id=_tree_id(i, len(picks)),
            task=task,
            snapshot=p["snapshot"],
            path=str(written_to / p["snapshot"]) if written_to else p["path"],
            global_index=p["global_index"],
            agent_id=p["agent_id"],
            commit_hash=p["commit_hash"],
            score=p["score"],
            stage=p["stage"],
            selection_reason=p["selection_reason"],
        )
        for i, p in enumerate(picks, start=1)
    ]
    return roots, written_to


@dataclass
class PlannedRun:
    """A new exploration run, planned and checked, nothing written yet (:func:`plan_run`)."""

    run_id: str
    source: Path
    config: RunConfig
    roots: list[RootAdded]
    selection: Selection | None = None
    picks: list[dict[str, Any]] = field(default_factory=list)
    written_to: Path | None = None  # where the picks of a CORAL run are to be written as snapshot folders

    def copy_roots(self) -> None:
        """Write the picks out as snapshot folders when they are attempts of a CORAL run (before the log)."""
        if self.written_to is not None:  # (an earlier attempt at this run id that failed later is replaced)
            copy_snapshots(self.picks, self.written_to, True, self.run_id, self.config.direction or "maximize")

    def begin(self, writer: LogWriter, teacher_version: str) -> Catalog:
        """The run's first events, in its log and in the engine's catalog (see :func:`_start`)."""
        return _start(writer, self.config, self.source, self.selection, self.roots, teacher_version)


def plan_run(
    data_dir: Path, source: Path, config: RunConfig, run_id: str | None = None, select: bool = False
) -> PlannedRun:
    """Check ``source`` and ``config`` for a new run and choose its roots (see :func:`new_run`)."""
    if select and not config.task:
        raise InputError("--select needs the task's name (--task)")
    if not select:
        roots, task, direction = roots_from_dir(source, config.task, config.direction, data_dir)
        config = config.model_copy(update={"task": task, "direction": direction})
    run_id = check_run_id(run_id) if run_id else default_run_id(data_dir, "explore", config.task)
    _refuse_existing(data_dir, run_id)
    run_dir = EventLog(data_dir, run_id).dir
    if config.backend == "opencode":  # record the resolved options (never a secret value)
        from engine.teachers.opencode import resolve_options

        config = config.model_copy(update={"backend_options": resolve_options(config.backend_options)})
    if not select:
        return PlannedRun(run_id, source, config, roots)
    selection = plan_selection(source, config, "explore", run_id, data_dir)
    roots, written_to = _roots_from_selection(selection.picks, selection.config.task, run_dir / "roots")
    return PlannedRun(run_id, source, selection.config, roots, selection, selection.picks, written_to)


def new_run(
    data_dir: Path,
    source: Path,
    config: RunConfig,
    run_id: str | None = None,
    select: bool = False,
    *,
    on_progress: Progress | None = None,
    on_start: Callable[[str, RunConfig], None] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> ExploreResult:
    """Create an exploration run over the roots in ``source`` and run it to the end.

    ``on_start`` is called with the run id and its config (task and direction resolved)
    once the run exists; ``on_progress`` as the engine goes (see Explorer).
    ``executor``: where turns run (``local``: this machine; ``ray``: the Ray cluster
    at ``ray_address``, see engine.mcts.cluster).
    With ``select``, ``source`` is a task's ``all_snapshots`` dir or a CORAL run: the
    selection is recorded in this run (ALGORITHM §1) and its picks become the roots
    (a CORAL run's attempts are first written out as snapshot folders in the run's
    ``roots/``).
    """
    plan = plan_run(data_dir, source, config, run_id, select)
    if executor == "local":
        check_memory(turn_memory_mb(plan.config), plan.config.parallel)
    with claimed(data_dir, [(RUN, plan.run_id)], "choose another --run-id"):  # its directory, gone if no event
        teacher = make_teacher(plan.config, EventLog(data_dir, plan.run_id).dir)  # fails before the run exists
        try:
            plan.copy_roots()
            with LogWriter.create(data_dir, plan.run_id) as writer:
                catalog = plan.begin(writer, teacher.version)
                if on_start:
                    on_start(plan.run_id, plan.config)
                _explore(writer, catalog, plan.config, teacher, on_progress, False, executor, ray_address)
        finally:
            teacher.close()
    return run_summary(data_dir, plan.run_id, resumed=False)


def _start(
    writer: LogWriter,
    config: RunConfig,
    source: Path,
    selection: Selection | None,
    roots: list[RootAdded],
    teacher_version: str,
) -> Catalog:
    """The run's first events, in its log and in the engine's catalog: RunStarted (with the Teacher's
    version), the selection made here (when there is one) and the roots."""
    catalog = Catalog.empty(threads=DECISION_THREADS)
    teacher = {"teacher_version": teacher_version}
    if selection is None:
        catalog.insert(writer.stage([run_started("explore", config, source).model_copy(update=teacher)]))
    else:
        catalog.insert(writer.stage([selection.started.model_copy(update=teacher), *selection.facts]))
        detail = picked_detail(catalog, config.task)  # type: ignore[arg-type]
        catalog.insert(writer.stage([SnapshotsPicked(watermark=writer.tail, task=config.task, detail=detail)]))
    catalog.insert(writer.stage(roots))
    writer.flush()
    return catalog


def _refuse_existing(data_dir: Path, run_id: str) -> None:
    if EventLog(data_dir, run_id).exists():
        raise InputError(f"run {run_id!r} already exists - choose another --run-id or --resume it")
    refuse_clashes(data_dir, RUN, run_id, "choose another --run-id")  # a campaign's name, another case


EXECUTORS = ("local", "ray")
RESUMED = "resumed from the log"


def ray_executor(
    executor: str, config: RunConfig, run_dir: Path, ray_address: str | None, needed: int | None = None
) -> RayExecutor | None:
    """The Ray cluster a run's turns go to (``needed``: the slots it must hold), or None for ``local``
    (this process's threads); InputError for an executor of no such name."""
    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r} (use {' or '.join(EXECUTORS)})")
    if executor != "ray":
        return None
    from engine.mcts.cluster import RayExecutor

    return RayExecutor(config, run_dir, ray_address, needed)


def _explore(
    writer: LogWriter,
    catalog: Catalog,
    config: RunConfig,
    teacher: Teacher,
    on_progress: Progress | None,
    resumed: bool,
    executor: str,
    ray_address: str | None,
    note: str = RESUMED,
) -> None:
    """Run the engine; ``teacher`` forks roots and discards states, the executor runs the turns."""
    cluster = None
    try:
        cluster = ray_executor(executor, config, writer.log.dir, ray_address)
        runner = cluster.run_turn if cluster else None
        Explorer(writer, catalog, config, teacher, on_progress, runner).run(resumed=resumed, note=note)
    finally:
        if cluster is not None:
            cluster.close()


def resume_run(
    data_dir: Path,
    run_id: str,
    *,
    on_progress: Progress | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    parallel: int | None = None,
    turn_timeout: float | None = None,
) -> ExploreResult:
    """Continue an interrupted exploration run from its log.

    ``on_start`` is called with the run's progress (``run_progress``), task and direction before
    anything runs; a finished run is only summarized. ``executor``, ``ray_address``:
    as for :func:`new_run` (a run may resume on another executor than it started on).
    ``parallel``, ``turn_timeout``: the slots and the opencode turn timeout from now
    on (default: the recorded ones; see :func:`resumed_config`).
    """
    log = EventLog(data_dir, run_id).require()
    with growing(data_dir, run_id) as (writer, catalog, config, finished):
        command = catalog.query("select command from run_config")
        if not command or command[0]["command"] != "explore":
            raise LogError(f"run {run_id!r} is not an exploration run - nothing to resume")
        note = RESUMED
        if config.grants is not None:
            raise LogError(
                f"run {run_id!r} grows by the grants of campaign {config.grants.campaign!r}: continue it with "
                f"'{command_line(data_dir, 'campaign', '--resume', config.grants.campaign)}'"
            )
        if not finished:
            config, note = resumed_config(run_id, config, parallel, turn_timeout)
        if on_start:
            said = {"task": config.task, "direction": config.direction, "finished": finished}
            on_start(catalog.query("select * from run_progress")[0] | said)
        if not finished:
            if executor == "local":
                check_memory(turn_memory_mb(config), config.parallel)
            teacher = make_teacher(config, log.dir)
            try:
                _explore(writer, catalog, config, teacher, on_progress, True, executor, ray_address, note)
            finally:
                teacher.close()
        else:  # killed after its last part was published, before the spool was removed
            Spool(log.dir).clear()
    return run_summary(data_dir, run_id, resumed=not finished)


def resumed_config(
    run_id: str, config: RunConfig, parallel: int | None, turn_timeout: float | None
) -> tuple[RunConfig, str]:
    """The recorded config with the deployment choices a resume may change, and the RunResumed note.

    The slots and a turn's timeout are how the run is deployed, not what it
    decides: no view reads them, so replay derives every decision as before (in
    rounds mode a batch is ``parallel`` edges, so other slots grow other trees from
    the resume on than an uninterrupted run would). The note records what changed.
    """
    changes: dict[str, Any] = {}
    said = []
    if parallel is not None and parallel != config.parallel:
        changes["parallel"] = parallel
        said.append(f"parallel {parallel} (recorded {config.parallel})")
    if turn_timeout is not None:
        recorded = config.backend_options.get("turn_timeout_s")
        if recorded is None:
            raise OptionError(
                "--turn-timeout", f"run {run_id!r} uses the {config.backend} backend, whose turns have no timeout"
            )
        if turn_timeout != recorded:
            changes["backend_options"] = config.backend_options | {"turn_timeout_s": turn_timeout}
            said.append(f"turn_timeout_s {turn_timeout:g} (recorded {recorded:g})")
    config = config.model_copy(update=changes)
    problem = parallel_problem(config.parallel)
    if problem:  # (a --parallel given is checked before: this is the recorded one)
        raise InputError(f"run {run_id!r}: its recorded parallel {problem}; resume it with a smaller --parallel")
    return config, "; ".join([RESUMED, *said])


def run_summary(data_dir: Path, run_id: str, resumed: bool) -> ExploreResult:
    """The trees and totals of a run, read back from its log (through a reader of the writer's own: the
    process that explored reads once, at its end)."""
    with Reader(data_dir).open(run_id) as catalog:
        trees = catalog.query("select * from trees order by tree_id")
        progress = catalog.query("select * from run_progress")[0]
        top_k = catalog.query("select top_k from run_config")[0]["top_k"]
        counts = supervision_counts(catalog, default_rule(catalog).selection_id)
    return ExploreResult(run_id, resumed, trees, progress, top_k, counts)
