"""Creating and resuming exploration runs: roots, config, Teacher backend, summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.catalog import Catalog
from engine.config import RunConfig, problems
from engine.explore import Explorer, Progress
from engine.select import TOOL_VERSION, default_run_id, picked_detail, plan_selection
from engine.teacher import Teacher
from ingest.errors import InputError, LogError
from ingest.events import RootAdded, RunStarted, SnapshotsPicked
from ingest.log import EventLog, LogWriter, check_run_id
from ingest.snapshots import read_direction, read_snapshot

ENGINE_THREADS = 1  # deterministic float sums for recorded decisions (see Catalog.empty)


@dataclass
class ExploreResult:
    """What an exploration run holds once the engine returns."""

    run_id: str
    resumed: bool
    trees: list[dict[str, Any]]
    progress: dict[str, Any]
    paths: list[dict[str, Any]]
    top_k: int


def make_teacher(config: RunConfig, run_dir: Path) -> Teacher:
    """The Teacher backend named by the config."""
    if config.backend == "sim":
        from engine.sim import SimTeacher

        return SimTeacher(config.seed, config.backend_options)
    if config.backend == "opencode":
        from engine.opencode import OpenCodeTeacher

        return OpenCodeTeacher(config, run_dir)
    raise InputError(f"unknown backend {config.backend!r} (use sim or opencode)")


def _tree_id(i: int, n: int) -> str:
    return f"T{i:0{max(3, len(str(n)))}d}"


def roots_from_dir(roots_dir: Path, task: str) -> tuple[list[RootAdded], str]:
    """RootAdded facts for every snapshot folder of a ``select-snapshots`` output.

    Folders are ordered by (global index, name); each needs a numeric score (its
    attempt JSON, as for selection). ``stage`` and ``selection_reason`` come from
    the copied ``metadata.json`` when present. Also returns the direction the
    snapshots' CORAL config gives (maximize when none).
    """
    roots_dir = Path(roots_dir)
    if not roots_dir.is_dir():
        raise InputError(f"{roots_dir}: not a directory")
    facts = [read_snapshot(p, task) for p in sorted(roots_dir.iterdir())]
    problems = [f"{f.snapshot}: {f.skip_reason}" for f in facts if f.skip_reason]
    problems += [
        f"{f.snapshot}: no numeric score ({f.score_problem})"
        for f in facts
        if not f.skip_reason and f.score is None
    ]
    if problems:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        raise InputError(f"{roots_dir}: cannot use every folder as a root: {shown}")
    if not facts:
        raise InputError(f"{roots_dir}: no snapshot folders to explore from")
    facts.sort(key=lambda f: (f.global_index, f.snapshot))
    roots = []
    for i, f in enumerate(facts, start=1):
        meta = json.loads((Path(f.path) / "metadata.json").read_text())
        roots.append(
            RootAdded(
                tree_id=_tree_id(i, len(facts)), task=task, snapshot=f.snapshot,
                path=str(Path(f.path).resolve()), global_index=f.global_index,
                agent_id=f.agent_id, commit_hash=f.commit_hash, score=f.score,
                stage=meta.get("stage") if isinstance(meta.get("stage"), str) else None,
                selection_reason=meta.get("selection_reason")
                if isinstance(meta.get("selection_reason"), str) else None,
            )
        )  # fmt: skip
    return roots, read_direction(roots_dir, facts) or "maximize"


def _roots_from_selection(catalog: Catalog, task: str) -> list[RootAdded]:
    picks = catalog.query(
        "select * from snapshots where task = ? and selected order by global_index, snapshot", [task]
    )
    return [
        RootAdded(
            tree_id=_tree_id(i, len(picks)), task=task, snapshot=p["snapshot"], path=p["path"],
            global_index=p["global_index"], agent_id=p["agent_id"], commit_hash=p["commit_hash"],
            score=p["score"], stage=p["stage"], selection_reason=p["selection_reason"],
        )
        for i, p in enumerate(picks, start=1)
    ]  # fmt: skip


def new_run(
    data_dir: Path,
    source: Path,
    config: RunConfig,
    run_id: str | None = None,
    select: bool = False,
    progress: bool | None = None,
    on_start: Callable[[str], None] | None = None,
) -> ExploreResult:
    """Create an exploration run over the roots in ``source`` and run it to the end.

    ``on_start`` is called with the run id once the run exists.

    With ``select``, ``source`` is a task's ``all_snapshots`` dir: the selection is
    recorded in this run (SPEC §1) and its picks become the roots.
    """
    task = config.task
    if not task:
        raise InputError("a task name is needed (--task)")
    run_id = check_run_id(run_id) if run_id else default_run_id(data_dir, "explore", task)
    if EventLog(data_dir, run_id).exists():
        raise InputError(f"run {run_id!r} already exists - choose another --run-id or --resume it")
    if config.backend == "opencode":  # record the resolved options (never a secret value)
        from engine.opencode import resolve_options

        config = config.model_copy(update={"backend_options": resolve_options(config)})
    if select:
        events, catalog = plan_selection(source, task, run_id, config.direction, config.selection.num_roots)
        roots = _roots_from_selection(catalog, task)
        selection = [e for e in events if not isinstance(e, RunStarted)]
        direction = events[0].direction
    else:
        roots, direction = roots_from_dir(source, task)
        selection = []
    config = config.model_copy(update={"direction": config.direction or direction})
    make_teacher(config, EventLog(data_dir, run_id).dir).close()  # fail early, before the run exists
    started = RunStarted(
        command="explore", task=task, direction=config.direction,
        config=config.model_dump(mode="json") | {"source": str(Path(source).resolve())},
        tool_version=TOOL_VERSION,
    )  # fmt: skip
    catalog = Catalog.empty(threads=ENGINE_THREADS)
    with LogWriter.create(data_dir, run_id) as writer:
        catalog.insert(writer.stage([started, *selection]))
        if select:
            decision = SnapshotsPicked(watermark=writer.tail, task=task,
                                       detail=picked_detail(catalog, task))  # fmt: skip
            catalog.insert(writer.stage([decision]))
        catalog.insert(writer.stage(roots))
        writer.flush()
        if on_start:
            on_start(run_id)
        _explore(writer, catalog, config, progress)
    return summary(data_dir, run_id, resumed=False)


def _explore(writer: LogWriter, catalog: Catalog, config: RunConfig, progress: bool | None) -> None:
    teacher = make_teacher(config, writer.log.dir)
    try:
        explorer = Explorer(writer, catalog, config, teacher, Progress(catalog, progress))
        explorer.run()
    finally:
        teacher.close()


def resume_run(data_dir: Path, run_id: str, progress: bool | None = None) -> ExploreResult:
    """Continue an interrupted exploration run from its log."""
    log = EventLog(data_dir, run_id).require()
    with LogWriter.open(data_dir, run_id) as writer:
        catalog = Catalog.for_log(log, threads=ENGINE_THREADS)
        rows = catalog.query("select * from stg_run_started order by seq limit 1")
        if not rows or rows[0]["command"] != "explore":
            raise LogError(f"run {run_id!r} is not an exploration run - nothing to resume")
        if catalog.query("select count(*) as n from stg_run_finished")[0]["n"]:
            return summary(data_dir, run_id, resumed=False)
        try:
            config = RunConfig.model_validate(
                {k: v for k, v in json.loads(rows[0]["config"]).items() if k != "source"}
            )
        except ValidationError as err:
            raise LogError(f"{log.dir}: the recorded run config is not valid ({problems(err)})") from err
        teacher = make_teacher(config, writer.log.dir)
        try:
            explorer = Explorer(writer, catalog, config, teacher, Progress(catalog, progress))
            explorer.recover()
            explorer.run()
        finally:
            teacher.close()
    return summary(data_dir, run_id, resumed=True)


def summary(data_dir: Path, run_id: str, resumed: bool) -> ExploreResult:
    """The trees and totals of a run, read back from its log."""
    catalog = Catalog.for_log(EventLog(data_dir, run_id).require())
    trees = catalog.query("select * from trees order by tree_id")
    progress = catalog.query("select * from run_progress")[0]
    paths = catalog.query(
        """
        select tree_id, count(*) as paths, count(*) filter (where ranked) as ranked,
               count(*) filter (where selected) as selected,
               max(path_score) as top_path_score
        from paths group by tree_id order by tree_id
        """
    )
    top_k = catalog.query("select top_k from run_config")[0]["top_k"]
    return ExploreResult(run_id, resumed, trees, progress, paths, top_k)

