"""Replay: rebuild every tree from the log and re-derive every recorded decision.

With ``asof_points = 'decisions'`` the views are evaluated at the watermark of
every recorded decision at once - the tree views at each selection, stop and path
selection (and a campaign run's block grants and their closes), the snapshot views at
each pick - and each ``audit_*`` view lists the decisions that the log prefix they saw
does not imply. Replay is that: evaluate
at the watermarks, read every audit view. It works on a run that is still being
written: it checks the published prefix.

A collection's runs are replayed together, a million events' worth of runs in one
catalog (every view carries ``run_id`` first: docs/DECISIONS.md), so each statement is
planned once for them all rather than once a run; each result is its run's alone, as
:func:`replay_run` gives it (a test compares them). Runs whose configs give the views'
variables other defaults, or a batch that cannot be read whole (a damaged run), are
replayed a run at a time, which says what is wrong where the run's turn comes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from engine.catalog import Catalog
from engine.config import defaults_agree, recorded_config
from engine.runs import over_runs
from engine.runset import DamagedRun, RunSet
from ingest.errors import LogError
from ingest.events import DECISION_KINDS
from ingest.log import EventLog
from ingest.text import sql_text

# The decisions each run records, and its events (a batch's phase times are shared out by them).
_COUNTS = (
    "select run_id, count(*) filter (kind in ({})) as n, count(*) as events from events group by run_id order by run_id"
).format(", ".join(sql_text(k) for k in sorted(DECISION_KINDS)))
# Events replayed together in one catalog at most: runs of ~100k events are mostly the planning of
# their statements, paid once for a batch (measured: benchmarks/README.md).
TOGETHER_EVENTS = 1_000_000
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


def loaded_at_decisions(catalog: Catalog, *logs: EventLog) -> Catalog:
    """``catalog`` holding the published prefix of each of ``logs`` (runs whose configs are valid; in one scan),
    evaluated at its decisions."""
    catalog.load_runs([(log, None) for log in logs])
    for log in logs:
        recorded_config(catalog, log)
    return at_decisions(catalog)


def replay_run(data_dir: Path, run_id: str) -> ReplayResult:
    """Rebuild a run from its log and re-derive every recorded decision."""
    log = EventLog(data_dir, run_id).require()
    start = time.perf_counter()
    return _replay(log, Catalog.empty(), start)


def replay_runs(data_dir: Path, run_ids: list[str], workers: int | None = None) -> Iterator[ReplayResult]:
    """Replay each of these runs as :func:`replay_run` does; results in run order, keeping no catalog.

    Runs are replayed together, TOGETHER_EVENTS at most in a catalog (see the module
    doc); what a batch cannot take, run by run in the catalogs of
    :func:`~engine.runs.over_runs` (views created once, ``workers`` runs at a time).
    Every run is checked to exist first.
    """

    def work(log: EventLog, catalog: Catalog, started: float) -> ReplayResult:
        result = _replay(log, catalog, started)
        result.catalog = None
        return result

    logs = [EventLog(data_dir, run_id).require() for run_id in dict.fromkeys(run_ids)]
    for batch in _batches(logs):
        together = _replay_together(batch) if len(batch) > 1 else None
        if together is None:
            yield from over_runs(data_dir, [log.run_id for log in batch], work, workers)
        else:
            yield from together


def _batches(logs: list[EventLog]) -> list[list[EventLog]]:
    """The runs in order, in batches of TOGETHER_EVENTS events at most (a larger run alone)."""
    batches: list[list[EventLog]] = [[]]
    held = 0
    for log in logs:
        tail = log.tail_seq()
        if batches[-1] and held + tail > TOGETHER_EVENTS:
            batches.append([])
            held = 0
        batches[-1].append(log)
        held += tail
    return batches


def _replay_together(logs: list[EventLog]) -> list[ReplayResult] | None:
    """The replays of these runs from one catalog holding them all (None: they cannot share one); each run's
    phase times are the batch's, in proportion to its events."""
    start = time.perf_counter()
    catalog = Catalog.empty()
    try:
        marks = [start, time.perf_counter()]
        loaded_at_decisions(catalog, *logs)
        if not defaults_agree(catalog):
            return None
        marks.append(time.perf_counter())
        catalog.refresh()
        marks.append(time.perf_counter())
        differences: dict[str, list[Difference]] = {log.run_id: [] for log in logs}
        for name in sorted(v for v in catalog.views if v.startswith("audit_")):
            for row in catalog.query(f"select * from {name}"):
                differences[row.pop("run_id")].append(Difference(**row))
        trees: dict[str, list[dict[str, Any]]] = {log.run_id: [] for log in logs}
        for row in catalog.query("select * from trees order by run_id, tree_id"):
            trees[row.pop("run_id")].append(row)
        counts = {r["run_id"]: (r["n"], r["events"]) for r in catalog.query(_COUNTS)}
        marks.append(time.perf_counter())
    except (LogError, duckdb.Error):
        return None  # (replayed a run at a time: a damaged run's error raised at its turn)
    finally:
        catalog.close()
    seconds = [b - a for a, b in itertools.pairwise(marks)]
    events = sum(n for _, n in counts.values()) or 1
    results = []
    for log in logs:
        decisions, share = counts.get(log.run_id, (0, 0))
        found = sorted(differences[log.run_id], key=_order)
        phases = dict(zip(PHASES, (s * share / events for s in seconds), strict=True))
        results.append(ReplayResult(log.run_id, decisions, trees[log.run_id], found, None, phases))
    return results


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
    differences.sort(key=_order)
    trees = catalog.query("select * exclude (run_id) from trees order by tree_id")  # (the result's run)
    count = catalog.query(_COUNTS)[0]["n"]
    marks.append(time.perf_counter())
    seconds = dict(zip(PHASES, (b - a for a, b in itertools.pairwise(marks)), strict=True))
    return ReplayResult(log.run_id, count, trees, differences, catalog, seconds)


def _order(d: Difference) -> tuple:
    """Differences in log order, every field a tie-break (the rows' order within a query is not one)."""
    rest = (d.problem, d.tree_id, d.recorded, d.derived)
    return (d.seq is None, d.seq or 0, d.kind, d.subject, *(str(v) for v in rest))
