"""The audit of a collection: coverage, N_eff/N, learnability, tool errors, knowledge use, cost, violations.

Every figure is a row of a view (``coverage``, ``learnability``, ``tool_error_rates``,
``tool_error_messages``, ``knowledge_usage``, ``knowledge_improvement``, ``cost_tasks``,
``phase_times``, ``supervision_counts`` and every ``audit_*`` view); this module only chooses
which rows to show. It reads them
through a :class:`~engine.collection.Collection` (the runs' stored derived state), one
query a table for every run at once; the ``audit_*`` views read the states evaluated at
every decision, and the tables of final rows come from those same states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from engine.catalog import read_views
from engine.collection import Collection
from engine.runset import DamagedRun
from ingest.errors import InputError
from ingest.text import sql_text

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
    time: Rows
    supervision: Rows
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
    runs = Collection(data_dir, run_ids or None)
    checks = [
        f"select * from {view} order by run_id, seq nulls last, subject"
        for view in sorted(v for v in runs.views if v.startswith("audit_"))
    ]
    tables = _queries(by)
    # The states at every decision the audit views need hold the final rows too: derived once, for all
    runs.read_ahead([*checks, *tables.values()])
    violations = [row for sql in checks for row in runs.query(sql)]
    tables = {name: runs.query(sql) for name, sql in tables.items()}
    return AuditReport(runs=list(runs.run_ids), **tables, violations=violations, damaged=runs.damaged)


def _queries(by: tuple[str, ...]) -> dict[str, str]:
    """The query of each table, over every run's views (rows in run order, then the table's own)."""
    strata = ", ".join(sql_text(s) for s in ("all", *by))
    return {
        "coverage": f"select * from coverage where stratum in ({strata}) "
        f"order by run_id, list_position([{strata}], stratum), stratum_key",
        "learnability": "select * from learnability where flagged order by run_id, tree_id",
        "tool_errors": "select * exclude (n) from (select *, row_number() over (partition by run_id "
        "order by errors desc, message) as n from tool_error_messages) "
        f"where n <= {TOP_ERRORS} order by run_id, errors desc, message",
        "tool_error_rates": "select * from tool_error_rates where dimension = 'tool' order by run_id, calls desc, key",
        "knowledge": "select * from knowledge_usage where dimension = 'all' order by run_id, area, access",
        "knowledge_improvement": "select * from knowledge_improvement "
        "order by run_id, task, measure, with_knowledge desc",
        "cost": "select * from cost_tasks order by run_id, task",
        "time": "select * from phase_times order by run_id, node, phase_order",
        "supervision": "select * from supervision_counts order by run_id, selection_id, task, stage",
    }
