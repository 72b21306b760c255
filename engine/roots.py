"""Choosing the roots of a task (``select-snapshots``): scan, record, ask the views, copy.

Stages, quotas and picks are defined only in ``views/`` (``snapshots`` and
``snapshot_stages``); this module moves files and events around them. The source
is an ``all_snapshots/`` directory of snapshot folders, or a CORAL run directory
whose attempts are the candidates (``ingest.coral_run``; a pick is written out as
a snapshot folder). The copies carry their ``score``, ``stage``,
``selection_reason``, ``task``, ``direction`` and the id of the selection run in
their ``metadata.json``, so ``explore`` takes the task and its direction from them
(:func:`task_direction`).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine import __version__
from engine.catalog import Catalog
from engine.config import RunConfig, load_config
from ingest import coral_run
from ingest.errors import InputError, OptionError, OutputError, ProjectError, os_problem
from ingest.events import RunStarted, SnapshotSeen, SnapshotsPicked
from ingest.log import EventLog, LogWriter, check_run_id
from ingest.names import RUN, claimed, clashes, refuse_clashes
from ingest.paths import replace_dir, staging_dir
from ingest.schema import to_arrow
from ingest.snapshots import DIRECTIONS, NAME_RE, read_direction, read_metadata, scan


@dataclass
class SelectionResult:
    """What ``select-snapshots`` did, for the CLI to render."""

    run_id: str
    task: str
    direction: str
    num_roots: int
    out: Path | None
    stages: list[dict[str, Any]]
    picks: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def default_run_id(data_dir: Path, prefix: str, task: str) -> str:
    """A new run id ``<prefix>-<task>-<UTC time>`` that no run uses yet."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # A run id takes ASCII letters, digits, '_', '-' and '.' but never "..".
    safe_task = re.sub(r"\.\.+", "_", re.sub(r"[^A-Za-z0-9_.-]", "_", task))[:60]
    base = check_run_id(f"{prefix}-{safe_task}-{stamp}")
    candidate, n = base, 1
    while EventLog(data_dir, candidate).exists() or clashes(data_dir, RUN, candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _check_out(out: Path, source: Path, overwrite: bool, data_dir: Path) -> None:
    out_abs, src_abs, data_abs = out.resolve(), source.resolve(), Path(data_dir).resolve()
    if out_abs == src_abs or src_abs in out_abs.parents or out_abs in src_abs.parents:
        raise InputError(f"{out}: the output must be outside the input {source}")
    if out_abs == data_abs or out_abs in data_abs.parents:
        raise InputError(f"{out}: the output must not hold the data directory {data_dir}")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    _check_replaceable(out, overwrite)


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """``out`` is empty, or (with ``overwrite``) holds only snapshot folders, as we write."""
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise InputError(f"{out}: not empty - pass --overwrite to replace its contents")
    other = next((e.name for e in sorted(out.iterdir()) if not (e.is_dir() and NAME_RE.fullmatch(e.name))), None)
    if other is not None:
        msg = (
            f"{out}: holds {other!r}, not a snapshot folder - --overwrite only replaces "
            "an earlier select-snapshots output"
        )
        raise InputError(msg)


class DirectionError(InputError):
    """The direction of the task whose snapshots were given cannot be told (:func:`task_direction`)."""


class DirectionConflict(DirectionError):
    """A direction given that disagrees with the one the snapshots were selected with.

    ``said_as(label)``: the same error naming where the direction was given
    (``--direction``, a campaign task's ``direction``...).
    """

    def __init__(self, given: str, recorded: str, source: Path, how: str, label: str = "the direction given") -> None:
        self.given, self.recorded, self.source, self.how = given, recorded, source, how
        super().__init__(
            f"{label} is {given}, but the snapshots in {source} were selected for a task to {recorded} "
            f"({how}) - leave it out, or give {recorded}"
        )

    def said_as(self, label: str) -> DirectionConflict:
        return DirectionConflict(self.given, self.recorded, self.source, self.how, label)


def task_direction(
    source: Path,
    facts: list[SnapshotSeen],
    metas: dict[str, dict[str, Any]],
    given: str | None,
    data_dir: Path | None,
) -> str:
    """The direction of the task whose snapshot folders are ``facts`` (``metas``: their
    ``metadata.json`` by snapshot; skipped folders are left out).

    Folders a selection copied carry the direction it was made for (``direction`` in
    ``metadata.json``; copies made before they did: the one the selection run named by
    ``selection_run`` records, when that run is in ``data_dir`` and holds the folder
    and its task). Those must agree among themselves, and ``given`` (explore's or
    select-snapshots' ``--direction``, a campaign task's) with them: DirectionError, a
    DirectionConflict for the latter. Without any: ``given``, else the CORAL config
    the snapshots carry, else maximize.
    """
    recorded: dict[str, list[str]] = {}  # direction -> the folders that record it
    runs: dict[str, list[str]] = {}  # direction -> the selection runs named (how it was recorded)
    by_run: dict[str, dict[str, Any] | None] = {}
    for fact in facts:
        if fact.skip_reason is not None or fact.snapshot not in metas:
            continue
        meta = metas[fact.snapshot]
        run = meta.get("selection_run") if isinstance(meta.get("selection_run"), str) else None
        value = meta.get("direction")
        if value is not None and value not in DIRECTIONS:
            shown = json.dumps(value, allow_nan=True)[:80]
            raise DirectionError(
                f"{source}: {fact.snapshot}: direction in metadata.json is {shown}, not maximize or minimize"
            )
        if value is None and run is not None and data_dir is not None:
            if run not in by_run:
                by_run[run] = _selection_run(data_dir, run)
            value = _recorded_by(by_run[run], meta.get("task"), fact.snapshot)
            how = f"recorded in the log of run {run}"
        else:
            how = f"recorded in their metadata.json by run {run}" if run else "recorded in their metadata.json"
        if value is not None:
            recorded.setdefault(value, []).append(fact.snapshot)
            runs.setdefault(value, [])
            if how not in runs[value]:
                runs[value].append(how)
    if len(recorded) > 1:
        shown = "; ".join(
            f"{d}: {', '.join(names[:2])}{f' (+{len(names) - 2} more)' if len(names) > 2 else ''}"
            for d, names in sorted(recorded.items())
        )
        raise DirectionError(
            f"{source}: the snapshots were selected with different directions ({shown}) - "
            "use the snapshots of one selection at a time"
        )
    if recorded:
        direction = next(iter(recorded))
        if given is not None and given != direction:
            raise DirectionConflict(given, direction, source, "; ".join(runs[direction][:2]))
        return direction
    return given or read_direction(source, facts) or "maximize"


def _selection_run(data_dir: Path, run_id: str) -> dict[str, Any] | None:
    """What a selection run records of its start (command, task, direction) and the snapshot folders it saw;
    None when ``data_dir`` holds no such run, or no readable one."""
    try:
        log = EventLog(data_dir, check_run_id(run_id))
        if not log.exists():
            return None
        started = [r for t in log.scan_kind("run_started", ["command", "task", "direction"]) for r in t.to_pylist()]
        seen = {s for t in log.scan_kind("snapshot_seen", ["snapshot"]) for s in t.column("snapshot").to_pylist()}
    except (ProjectError, OSError):
        return None
    return started[0] | {"seen": seen} if started else None


def _recorded_by(run: dict[str, Any] | None, task: Any, snapshot: str) -> str | None:
    """The direction a selection run records for a folder it selected (None: the run is not the one that did)."""
    if run is None or run["command"] not in ("select-snapshots", "explore") or run["task"] != task:
        return None
    if snapshot not in run["seen"] or run["direction"] not in DIRECTIONS:
        return None
    return run["direction"]


@dataclass
class Selection:
    """A selection as planned: the run's first event, what the scan saw, and the picks the views make.

    ``catalog`` is a scratch catalog holding ``started`` and ``facts`` (not a run's log).
    """

    config: RunConfig  # the run's config, its direction resolved
    started: RunStarted
    facts: list[Any]
    catalog: Catalog
    picks: list[dict[str, Any]]


def plan_selection(
    source: Path, config: RunConfig, command: str, run_id: str, data_dir: Path | None = None
) -> Selection:
    """Scan and check a snapshot dir or CORAL run for ``config.task``; the selection its views make.

    A direction ``config`` leaves open is the source's (maximize when it gives none);
    snapshots an earlier selection copied keep the direction it recorded
    (:func:`task_direction`: one given that disagrees is refused). Raises InputError
    when the directory is neither or has no numeric score.
    """
    task = config.task
    if not task:
        raise OptionError("--task", "must not be empty")
    coral = coral_run.find_coral(source)
    if coral is not None:
        facts = coral_run.scan(coral, task)
        direction = config.direction or coral_run.direction(coral) or "maximize"
    else:
        facts = scan(source, task)
        metas = {f.snapshot: read_metadata(Path(f.path)) for f in facts if f.skip_reason is None}
        direction = task_direction(source, facts, metas, config.direction, data_dir)
    config = config.model_copy(update={"direction": direction})  # (the resolved direction is recorded)
    started = run_started(command, config, source)
    catalog = Catalog.empty()
    catalog.insert(to_arrow([started, *facts], run_id, 1, datetime.now(UTC)))
    counts = catalog.query(
        "select count(*) as candidates, count(score_for_stage) as numeric from int_snapshots__staged where is_now"
    )[0]
    if counts["candidates"] == 0:
        reasons = catalog.query("select skip_reason, count(*) as n from snapshots group by 1 order by n desc limit 3")
        detail = "; ".join(f"{r['n']} x {r['skip_reason']}" for r in reasons)
        raise InputError(f"{source}: no candidate snapshot ({detail})")
    if counts["numeric"] == 0:
        msg = (
            f"{source}: none of the {counts['candidates']} candidate snapshots has a "
            "numeric score in its attempt JSON, so stages cannot be computed"
        )
        raise InputError(msg)
    picks = catalog.query("select * from snapshots where task = ? and selected order by global_index, snapshot", [task])
    return Selection(config, started, facts, catalog, picks)


def run_started(command: str, config: RunConfig, source: Path) -> RunStarted:
    """The first event of a run: its command and whole config, and the source it started from."""
    return RunStarted(
        command=command,
        task=config.task,
        direction=config.direction,
        config=config.model_dump(mode="json") | {"source": str(Path(source).resolve())},
        tool_version=__version__,
    )


def picked_detail(catalog: Catalog, task: str) -> list[dict[str, Any]]:
    """Per candidate: stage, gain, whether selected and why (the decision's content)."""
    return catalog.query(
        """
        select snapshot, stage, gain, selected, selection_reason as reason
        from snapshots
        where task = ? and skip_reason is null
        order by candidate_index
        """,
        [task],
    )


def record_selection(data_dir: Path, run_id: str, selection: Selection) -> SnapshotsPicked:
    """Create the run, append the facts and the SnapshotsPicked decision."""
    task = selection.config.task
    with claimed(data_dir, [(RUN, run_id)], "choose another --run-id"), LogWriter.create(data_dir, run_id) as writer:
        writer.append([selection.started, *selection.facts], expected_seq=0)
        decision = SnapshotsPicked(watermark=writer.tail, task=task, detail=picked_detail(selection.catalog, task))
        selection.catalog.insert(writer.append([decision]))
    return decision


def copy_snapshots(
    picks: list[dict[str, Any]],
    out: Path,
    overwrite: bool,
    run_id: str,
    direction: str,
    then: Callable[[], None] | None = None,
) -> None:
    """Copy the picked folders into ``out``; each ``metadata.json`` gains the pick's fields.

    ``score``, ``stage``, ``selection_reason``, ``task``, the task's ``direction`` (the
    selection's, which explore keeps) and ``selection_run``.

    The copies are assembled in a hidden sibling directory and moved into place at
    the end, so ``out`` never holds a partial selection. ``then`` runs once they are
    in place, before an earlier output they replace is removed: if it fails, that
    output is put back (select-snapshots records its run there, so a run exists
    only once its copies do).
    """
    out = Path(out)
    staging = staging_dir(out)
    try:
        for pick in picks:
            src = Path(pick["path"])
            dest = staging / pick["snapshot"]
            if is_attempt(pick):
                coral_run.export(pick, dest)
            else:
                shutil.copytree(src, dest, symlinks=True)
            meta_path = dest / "metadata.json"
            meta = json.loads(meta_path.read_text())
            meta.update(
                score=pick["score"],
                stage=pick["stage"],
                selection_reason=pick["selection_reason"],
                task=pick["task"],
                direction=direction,
                selection_run=run_id,
            )
            meta_path.unlink()  # the copy may share nothing with the input, but be safe
            meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        replace_dir(staging, out, lambda: _check_replaceable(out, overwrite), then)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def is_attempt(pick: dict[str, Any]) -> bool:
    """Whether a pick is a CORAL run's attempt (a file), to be written out as a snapshot folder."""
    return Path(pick["path"]).is_file()


def select_snapshots(
    all_snapshots: Path,
    out: Path | None,
    task: str,
    data_dir: Path,
    *,
    direction: str | None = None,
    num_roots: int = 30,
    run_id: str | None = None,
    overwrite: bool = False,
) -> SelectionResult:
    """Choose the MCTS roots of one task and copy them to ``out`` (ALGORITHM §1)."""
    all_snapshots = Path(all_snapshots)
    if out is not None:
        _check_out(Path(out), all_snapshots, overwrite, data_dir)
    run_id = check_run_id(run_id) if run_id else default_run_id(data_dir, "select", task)
    if EventLog(data_dir, run_id).exists():
        raise InputError(f"run {run_id!r} already exists - choose another --run-id")
    refuse_clashes(data_dir, RUN, run_id, "choose another --run-id")  # a campaign's name, another case
    config = load_config(None, {"task": task, "direction": direction, "selection": {"num_roots": num_roots}})
    try:
        selection = plan_selection(all_snapshots, config, "select-snapshots", run_id, data_dir)
    except DirectionConflict as err:
        raise err.said_as("--direction") from err
    catalog, picks = selection.catalog, selection.picks
    copied: list[bool] = []

    def record() -> None:
        copied.append(True)
        record_selection(data_dir, run_id, selection)

    if out is None:
        record()
    else:  # the run is created once the copies are in place: a failed copy leaves no run behind
        try:
            copy_snapshots(picks, Path(out), overwrite, run_id, selection.config.direction, then=record)
        except OSError as err:
            if copied:  # recording failed (the copies were taken back): not a problem of OUT
                raise
            msg = (
                f"{out}: cannot copy the picked snapshots ({os_problem(err)}); nothing was "
                "written there and no run was recorded"
            )
            raise OutputError(msg) from err
    stages = catalog.query("select * from snapshot_stages where task = ? order by stage_order", [task])
    skipped = catalog.query(
        "select snapshot, skip_reason from snapshots where task = ? and skip_reason is not null order by snapshot",
        [task],
    )
    warnings = []
    eligible = sum(s["eligible"] for s in stages)
    if eligible < num_roots:
        warnings.append(f"only {eligible} eligible snapshots for {num_roots} roots: all of them were taken")
    return SelectionResult(run_id, task, selection.config.direction, num_roots, out, stages, picks, skipped, warnings)
