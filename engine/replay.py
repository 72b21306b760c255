"""Replay: rebuild every tree from the log and re-derive every recorded decision.

Tree decisions are re-derived in bulk: with ``asof_points = 'decisions'`` the tree
views are evaluated at the watermark of every recorded selection and stop, and the
``audit_*`` views list each decision the log prefix it saw does not imply. The few
whole-run decisions (snapshot picks, path selections) are re-derived one by one at
their watermark. Works on a run that is still being written: it checks the
published prefix.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import Catalog
from engine.paths import path_parameters, recorded_selections, top_paths
from engine.select import picked_detail
from ingest.events import DECISION_KINDS
from ingest.log import EventLog

TOLERANCE = 1e-9
# What replay_run times (ReplayResult.seconds): creating the views, loading the log's
# events, the tree tables at every decision point, the tree decisions' audits and
# summaries, the whole-run decisions (snapshot picks, path selections).
PHASES = ("views", "events", "tree tables", "tree decisions", "whole-run decisions")


@dataclass
class Difference:
    """A recorded decision and what the log implies instead."""

    seq: int | None
    kind: str
    tree_id: str | None
    subject: str
    problem: str
    recorded: str | None
    derived: str | None


@dataclass
class ReplayResult:
    """Per-tree rebuild and the decisions checked."""

    run_id: str
    decisions: int
    trees: list[dict[str, Any]]
    differences: list[Difference] = field(default_factory=list)
    catalog: Catalog | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase


def load(data_dir: Path, run_id: str) -> Catalog:
    """A catalog over the published prefix of a run, evaluated at every decision point."""
    log = EventLog(data_dir, run_id).require()
    catalog = Catalog.empty()
    _load_into(catalog, log)
    return catalog


def _load_into(catalog: Catalog, log: EventLog) -> None:
    catalog.load(log)
    catalog.set_points("decisions")


def replay_run(data_dir: Path, run_id: str) -> ReplayResult:
    """Rebuild a run from its log and re-derive every recorded decision."""
    log = EventLog(data_dir, run_id).require()
    marks = [time.perf_counter()]
    catalog = Catalog.empty()
    marks.append(time.perf_counter())
    _load_into(catalog, log)
    marks.append(time.perf_counter())
    catalog.refresh()  # every tree table, at every decision point
    marks.append(time.perf_counter())
    differences = [
        Difference(**row)
        for name in sorted(v for v in catalog.views if v.startswith("audit_"))
        for row in catalog.query(f"select * from {name}")
    ]
    trees = tree_summaries(catalog)
    kinds = ", ".join(f"'{k}'" for k in sorted(DECISION_KINDS))
    count = catalog.query(f"select count(*) as n from event_log where kind in ({kinds})")[0]["n"]
    marks.append(time.perf_counter())
    # Last: a decision that later events would change is re-derived at its own
    # watermark, after which the tree tables are evaluated again when next read.
    differences += _check_snapshot_picks(catalog) + _check_path_selections(catalog)
    differences.sort(key=lambda d: (d.seq is None, d.seq or 0, d.kind, d.subject))
    marks.append(time.perf_counter())
    seconds = dict(zip(PHASES, (b - a for a, b in itertools.pairwise(marks)), strict=True))
    return ReplayResult(run_id, count, trees, differences, catalog, seconds)


def tree_summaries(catalog: Catalog) -> list[dict[str, Any]]:
    """Per tree: nodes, edges by verdict, leaves by reason, stop, best score (the trees view)."""
    return catalog.query(
        """
        select
            tree_id, nodes, edges_kept as kept, edges_kept_exempt as kept_exempt,
            edges_pruned as pruned, edges_retried as retried, depth_leaves, token_leaves,
            exhausted_leaves, stopped_leaves, stop_reason, best_score, status
        from trees
        order by tree_id
        """
    )  # fmt: skip


def _events_after(catalog: Catalog, seq: int, kinds: set[str]) -> bool:
    """Whether events of these kinds follow ``seq`` in the log."""
    if not kinds:
        return False
    where = "kind in (" + ", ".join(f"'{k}'" for k in sorted(kinds)) + ")"
    rows = catalog.query(f"select count(*) as n from event_log where seq > ? and {where}", [seq])
    return rows[0]["n"] > 0


def _at_watermark(catalog: Catalog, watermark: int, view: str):
    """Evaluate ``view`` at a decision's prefix; cheap when no event it reads followed."""

    class _Prefix:
        def __enter__(self) -> Catalog:
            self.moved = _events_after(catalog, watermark, catalog.kinds_read(view))
            if self.moved:
                catalog.set_points("now")
                catalog.set_watermark(watermark)
            return catalog

        def __exit__(self, *exc: object) -> None:
            if self.moved:
                catalog.set_watermark(None)
                catalog.set_points("decisions")

    return _Prefix()


def _check_snapshot_picks(catalog: Catalog) -> list[Difference]:
    out = []
    for row in catalog.query("select * from stg_snapshots_picked order by seq"):
        recorded = json.loads(row["detail"])
        with _at_watermark(catalog, row["watermark"], "snapshots"):
            derived = picked_detail(catalog, row["task"])
        out += _compare_lists(row["seq"], "snapshots_picked", None, recorded, derived,
                              key="snapshot", fields=("stage", "gain", "selected", "reason"))  # fmt: skip
    return out


def _check_path_selections(catalog: Catalog) -> list[Difference]:
    out = []
    for sel in recorded_selections(catalog):
        with _at_watermark(catalog, sel["watermark"], "top_paths"):
            derived = top_paths(catalog, sel["weights"], sel["top_k"])
        recorded = sel["paths"]
        for p in recorded + derived:
            p["path"] = f"{p['tree_id']}:{p['leaf_id']}"
        out += _compare_lists(sel["seq"], "paths_selected", None, recorded, derived,
                              key="path", fields=("rank", "path_score"))  # fmt: skip
    return out


def _compare_lists(
    seq: int, kind: str, tree_id: str | None, recorded: list[dict], derived: list[dict],
    key: str, fields: tuple[str, ...],
) -> list[Difference]:
    rec, der = {r[key]: r for r in recorded}, {d[key]: d for d in derived}
    out = []
    for name in sorted(rec.keys() | der.keys()):
        r, d = rec.get(name), der.get(name)
        if r is None or d is None:
            out.append(Difference(seq, kind, tree_id, name,
                                  "not derived" if d is None else "not recorded",
                                  _show(r, fields), _show(d, fields)))  # fmt: skip
            continue
        if any(not _same(r.get(f), d.get(f)) for f in fields):
            out.append(Difference(seq, kind, tree_id, name, "differs", _show(r, fields), _show(d, fields)))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, or floats within TOLERANCE (as the views' ``differs``: NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= TOLERANCE
    return a == b


def _show(row: dict | None, fields: tuple[str, ...]) -> str | None:
    if row is None:
        return None
    return ", ".join(f"{f}={row.get(f)}" for f in fields)


def draw_tree(catalog: Catalog, tree_id: str) -> list[str]:
    """Lines drawing one tree: node, score, soft, tok, verdict, leaf reason, selected paths."""
    nodes = catalog.query(
        """
        select n.node_id, n.parent_id, n.depth, n.score, n.tok, n.leaf_reason,
               e.soft, e.verdict, node_key(n.node_id) as key
        from nodes as n
        left join edges as e on e.tree_id = n.tree_id and e.child_id = n.node_id
        where n.tree_id = ?
        order by key
        """,
        [tree_id],
    )  # fmt: skip
    if not nodes:
        return []
    with path_parameters(catalog, *_defaults(catalog)):
        on_path = {
            n for row in catalog.query("select node_ids from top_paths where tree_id = ?", [tree_id])
            for n in row["node_ids"]
        }  # fmt: skip
    failed = catalog.query(
        "select parent_id, edge_id, verdict from edges where tree_id = ? and child_id is null "
        "order by started_seq",
        [tree_id],
    )
    by_parent: dict[str, list[str]] = {}
    for f in failed:
        by_parent.setdefault(f["parent_id"], []).append(f"{f['edge_id']} {f['verdict'] or 'in flight'}")
    lines = []
    for n in nodes:
        indent = "  " * n["depth"]
        mark = "*" if n["node_id"] in on_path else " "
        parts = [f"{indent}{mark} {n['node_id']}", f"score {_num(n['score'])}", f"tok {n['tok']}"]
        if n["depth"]:
            parts += [f"soft {_num(n['soft'])}", n["verdict"]]
        if n["leaf_reason"]:
            parts.append(f"leaf: {n['leaf_reason']}")
        lines.append("  ".join(parts))
        for f in by_parent.get(n["node_id"], []):
            lines.append(f"{indent}    x {f}")
    return lines


def _defaults(catalog: Catalog):
    from engine.paths import default_parameters

    return default_parameters(catalog)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
