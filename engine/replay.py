"""Replay: rebuild every tree from the log and re-derive every recorded decision.

With ``asof_points = 'decisions'`` the views are evaluated at the watermark of
every recorded decision at once - the tree views at each selection, stop and path
selection, the snapshot views at each pick - and each ``audit_*`` view lists the
decisions that the log prefix they saw does not imply. Replay is that: evaluate
at the watermarks, read every audit view. It works on a run that is still being
written: it checks the published prefix.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import Catalog
from engine.config import recorded_config
from engine.runs import over_runs
from engine.runset import DamagedRun, RunSet
from ingest.events import DECISION_KINDS
from ingest.log import EventLog

# What replay_run times (ReplayResult.seconds): creating the views, loading the log's
# events, the tree tables at every decision point, the audits and the trees' rows.
PHASES = ("views", "events", "tree tables", "audits")


@dataclass
class Difference:
    """A recorded decision and what the log implies instead (a row of an audit_* view)."""

    seq: int | None
    kind: str
    tree_id: str | None
    subject: str
    problem: str
    recorded: str | None
    derived: str | None


@dataclass
class ReplayResult:
    """Every tree rebuilt (rows of the ``trees`` view) and the decisions checked."""

    run_id: str
    decisions: int
    trees: list[dict[str, Any]]
    differences: list[Difference] = field(default_factory=list)
    catalog: Catalog | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase


def at_decisions(catalog: Catalog) -> Catalog:
    """Make the views evaluate at every recorded decision's watermark, as well as now."""
    catalog.variables.set(asof_points="decisions")
    return catalog


def loaded_at_decisions(catalog: Catalog, log: EventLog) -> Catalog:
    """``catalog`` holding the published prefix of ``log`` (a run whose config is valid), evaluated at its decisions."""
    catalog.load(log)
    recorded_config(catalog, log)
    return at_decisions(catalog)


def replay_run(data_dir: Path, run_id: str) -> ReplayResult:
    """Rebuild a run from its log and re-derive every recorded decision."""
    log = EventLog(data_dir, run_id).require()
    start = time.perf_counter()
    return _replay(log, Catalog.empty(), start)


def replay_runs(data_dir: Path, run_ids: list[str], workers: int | None = None) -> Iterator[ReplayResult]:
    """Replay each of these runs as :func:`replay_run` does, in one DuckDB instance; results in run order.

    The runs' catalogs come from :func:`~engine.runs.over_runs` (views created once,
    ``workers`` runs at a time); a result keeps no catalog.
    """

    def work(log: EventLog, catalog: Catalog, started: float) -> ReplayResult:
        result = _replay(log, catalog, started)
        result.catalog = None
        return result

    yield from over_runs(data_dir, run_ids, work, workers)


def replay_collection(data_dir: Path, run_ids: list[str]) -> tuple[list[str], list[DamagedRun], Iterator[ReplayResult]]:
    """The runs to replay (those named, else every run under ``data_dir``: :class:`~engine.runset.RunSet`),
    the damaged ones left out, and the replays of the others in run order."""
    runs = RunSet(data_dir, run_ids).checked()
    return runs.run_ids, runs.damaged, replay_runs(data_dir, runs.run_ids)


def _replay(log: EventLog, catalog: Catalog, start: float) -> ReplayResult:
    """Load ``log`` into the empty ``catalog``, evaluate the views at every decision, read the audits."""
    marks = [start, time.perf_counter()]
    loaded_at_decisions(catalog, log)
    marks.append(time.perf_counter())
    catalog.refresh()  # every tree table, at every decision point
    marks.append(time.perf_counter())
    differences = [
        Difference(**row)
        for name in sorted(v for v in catalog.views if v.startswith("audit_"))
        for row in catalog.query(f"select * exclude (run_id) from {name}")
    ]
    differences.sort(key=lambda d: (d.seq is None, d.seq or 0, d.kind, d.subject))
    trees = catalog.query("select * exclude (run_id) from trees order by tree_id")  # (the result's run)
    kinds = ", ".join(f"'{k}'" for k in sorted(DECISION_KINDS))
    count = catalog.query(f"select count(*) as n from events where kind in ({kinds})")[0]["n"]
    marks.append(time.perf_counter())
    seconds = dict(zip(PHASES, (b - a for a, b in itertools.pairwise(marks)), strict=True))
    return ReplayResult(log.run_id, count, trees, differences, catalog, seconds)
