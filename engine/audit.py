"""The audit of a collection: coverage, N_eff/N, learnability, tool errors, knowledge use, cost, violations.

Every figure is a row of a view (``coverage``, ``learnability``, ``tool_error_rates``,
``tool_error_messages``, ``knowledge_usage``, ``knowledge_improvement``, ``cost_tasks``
and every ``audit_*`` view); this module only chooses which rows to show. Every view
of a collection is per run (the union of the runs' rows, ``run_id`` first), so the
audit reads the runs a few at a time (:func:`~engine.runs.over_runs`, one per core):
each run's catalog is loaded, evaluated at its decisions, queried and dropped, and a
collection of any size is audited in the memory its largest runs take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from engine.catalog import Catalog, read_views
from engine.replay import loaded_at_decisions
from engine.runs import DamagedRun, over_runs, runs_to_read
from ingest.errors import InputError
from ingest.log import EventLog

TOP_ERRORS = 5

Rows = list[dict[str, Any]]


@dataclass
class AuditReport:
    """The tables of ``audit``, each a list of view rows (every row carries run_id)."""

    runs: list[str]
    coverage: Rows
    learnability: Rows
    tool_errors: Rows
    tool_error_rates: Rows
    knowledge: Rows
    knowledge_improvement: Rows
    cost: Rows
    violations: Rows = field(default_factory=list)
    damaged: list[DamagedRun] = field(default_factory=list)  # runs under --data left out (none named)

    def tables(self) -> dict[str, Rows]:
        return {k: v for k, v in vars(self).items() if k not in ("runs", "damaged")}


def strata() -> tuple[str, ...]:
    """The strata ``--by`` takes: those of the ``coverage_strata`` view but ``all`` (always listed)."""
    with duckdb.connect() as con:
        rows = con.execute(read_views()["coverage_strata"].sql).fetchall()
    return tuple(name for name, _order in sorted(rows, key=lambda r: r[1]) if name != "all")


def parse_by(text: str | None) -> tuple[str, ...]:
    """``task,stage`` into strata; InputError names an unknown one."""
    by = tuple(s.strip() for s in (text or "task,stage").split(",") if s.strip())
    known = strata()
    unknown = [s for s in by if s not in known]
    if unknown:
        raise InputError(f"--by: unknown stratum {unknown[0]!r} (use {', '.join(known)})")
    return by


def audit(data_dir: Path, run_ids: list[str] | None = None, by: tuple[str, ...] = ("task", "stage")) -> AuditReport:
    """The audit tables of these runs (default: every run under ``data_dir`` but the damaged ones), by ``by``.

    Rows are in run id order, then in each table's own order, as one query over the
    collection's union views ordering by ``run_id`` first would give them.
    """
    runs, damaged = runs_to_read(data_dir, run_ids)
    queries = _queries(by)

    def work(log: EventLog, catalog: Catalog, _started: float) -> tuple[dict[str, Rows], dict[str, Rows]]:
        loaded_at_decisions(catalog, log)
        found = {name: [{"run_id": log.run_id, **row} for row in catalog.query(sql)] for name, sql in queries.items()}
        audits = {view: [{"run_id": log.run_id, **row}
                         for row in catalog.query(f"select * from {view} order by seq nulls last, subject")]
                  for view in sorted(v for v in catalog.views if v.startswith("audit_"))}  # fmt: skip
        return found, audits

    tables: dict[str, Rows] = {name: [] for name in queries}
    violations: dict[str, Rows] = {}  # audit view -> its rows, listed view by view
    for found, audits in over_runs(data_dir, sorted(runs), work):
        for name, rows in found.items():
            tables[name] += rows
        for view, rows in audits.items():
            violations.setdefault(view, []).extend(rows)
    return AuditReport(runs=runs, **tables, violations=[r for view in sorted(violations) for r in violations[view]],
                       damaged=damaged)  # fmt: skip


def _queries(by: tuple[str, ...]) -> dict[str, str]:
    """The query of each table, over one run's views."""
    strata = ", ".join(f"'{s}'" for s in ("all", *by))
    return {
        "coverage": f"select * from coverage where stratum in ({strata}) "
                    f"order by list_position([{strata}], stratum), stratum_key",
        "learnability": "select * from learnability where flagged order by tree_id",
        "tool_errors": f"select * from tool_error_messages order by errors desc, message limit {TOP_ERRORS}",
        "tool_error_rates": "select * from tool_error_rates where dimension = 'tool' order by calls desc, key",
        "knowledge": "select * from knowledge_usage where dimension = 'all' order by area, access",
        "knowledge_improvement": "select * from knowledge_improvement order by task, measure, with_knowledge desc",
        "cost": "select * from cost_tasks order by task",
    }  # fmt: skip
