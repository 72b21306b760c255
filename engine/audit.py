"""The audit of a collection: coverage, N_eff/N, learnability, tool errors, knowledge use, cost, violations.

Every figure is a row of a view (``coverage``, ``learnability``, ``tool_error_rates``,
``tool_error_messages``, ``knowledge_usage``, ``knowledge_improvement``, ``cost_tasks``
and every ``audit_*`` view); this module only chooses which rows to show, over the
runs of a :class:`~engine.collection.Collection`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.collection import Collection
from ingest.errors import InputError

STRATA = ("task", "stage", "depth", "lineage", "root")
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

    def tables(self) -> dict[str, Rows]:
        return {k: v for k, v in vars(self).items() if k != "runs"}


def parse_by(text: str | None) -> tuple[str, ...]:
    """``task,stage`` into strata; InputError names an unknown one."""
    by = tuple(s.strip() for s in (text or "task,stage").split(",") if s.strip())
    unknown = [s for s in by if s not in STRATA]
    if unknown:
        raise InputError(f"--by: unknown stratum {unknown[0]!r} (use {', '.join(STRATA)})")
    return by


def audit(collection: Collection, by: tuple[str, ...] = ("task", "stage")) -> AuditReport:
    """The audit tables of every run of the collection, stratified by ``by``."""
    strata = ", ".join(f"'{s}'" for s in ("all", *by))
    q = collection.query
    violations = []
    for name in sorted(v for v in collection.views if v.startswith("audit_")):
        violations += q(f"select * from {name} order by run_id, seq nulls last, subject")
    return AuditReport(
        runs=collection.run_ids,
        coverage=q(f"select * from coverage where stratum in ({strata}) "
                   "order by run_id, list_position([" + strata + "], stratum), stratum_key"),  # fmt: skip
        learnability=q("select * from learnability where flagged order by run_id, tree_id"),
        tool_errors=q("select * from tool_error_messages qualify row_number() over (partition by run_id "
                      f"order by errors desc, message) <= {TOP_ERRORS} "
                      "order by run_id, errors desc, message"),  # fmt: skip
        tool_error_rates=q("select * from tool_error_rates where dimension = 'tool' "
                           "order by run_id, calls desc, key"),  # fmt: skip
        knowledge=q("select * from knowledge_usage where dimension = 'all' order by run_id, area, access"),
        knowledge_improvement=q("select * from knowledge_improvement order by run_id, task, measure, "
                                "with_knowledge desc"),  # fmt: skip
        cost=q("select * from cost_tasks order by run_id, task"),
        violations=violations,
    )
