"""A tree's rows as its drawings read them: the report's SVG and replay's text drawing.

Both drawings show the same things - the nodes in id order, the edge that made each,
the attempts that made no node under their parent, the nodes on a selected path - and
read them here, once, from the views ``nodes``, ``edges``, ``turns`` and ``top_paths``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]

# The columns the drawings read (the report's SVG and its tips, replay's lines): a collection's
# trees are read in one query a view, and the other columns would be read and held for nothing.
DRAWN = ("nodes", "edges", "turns", "top_paths")  # the views a drawing reads (besides trees)
COLUMNS = {
    "nodes": "node_id, parent_id, depth, score, tok, leaf_reason",
    "edges": "edge_id, parent_id, child_id, verdict, tok, soft, outcome, cleanliness, knowledge, "
    "regression_stability, tool_calls, tool_errors",
    "turns": "edge_id, turn, skipped, score, eval_status, knowledge_actions, steps",
}


@dataclass
class TreeRows:
    """One tree's rows: nodes by ``node_key``, edges and turns in the order they started."""

    nodes: list[Row] = field(default_factory=list)
    edges: list[Row] = field(default_factory=list)
    turns: list[Row] = field(default_factory=list)
    on_path: set[str] = field(default_factory=set)  # nodes on a selected path

    @property
    def creating(self) -> dict[str, Row]:
        """The edge that made each node, by the node's id."""
        return {e["child_id"]: e for e in self.edges if e["child_id"]}

    @property
    def failed(self) -> dict[str, list[Row]]:
        """The attempts that made no node (pruned, retried, in flight), by their parent's id, in started order."""
        out: dict[str, list[Row]] = defaultdict(list)
        for e in self.edges:
            if not e["child_id"]:
                out[e["parent_id"]].append(e)
        return out

    @property
    def turns_by_edge(self) -> dict[str, list[Row]]:
        out: dict[str, list[Row]] = defaultdict(list)
        for t in self.turns:
            out[t["edge_id"]].append(t)
        return out


def trees_by_run(query: Callable[[str], list[Row]], where: str) -> dict[str, dict[str, TreeRows]]:
    """The rows of every tree of a collection whose rows match ``where`` (an SQL condition on the views'
    columns), by run id and tree id: one query a view reads the trees of many runs."""
    return _trees(query, where, "run_id, ")  # type: ignore[return-value]


def tree_rows(query: Callable[[str], list[Row]], where: str) -> dict[str, TreeRows]:
    """The rows of every tree of a run's catalog (whose rows name no run) that match ``where``, by tree id."""
    return _trees(query, where, "").get(None, {})


def _trees(query: Callable[[str], list[Row]], where: str, run: str) -> dict[str | None, dict[str, TreeRows]]:
    """By run (``run``: the run's column, or "" for a catalog's rows, keyed None) and tree. A tree without
    nodes is absent."""
    runs: dict[str | None, dict[str, TreeRows]] = defaultdict(lambda: defaultdict(TreeRows))
    nodes = f"select {run}tree_id, {COLUMNS['nodes']} from nodes where {where} order by tree_id, node_key(node_id)"
    for n in query(nodes):
        runs[n.get("run_id")][n["tree_id"]].nodes.append(n)
    for name, order in (("edges", "started_seq"), ("turns", "edge_id, turn")):
        for r in query(f"select {run}tree_id, {COLUMNS[name]} from {name} where {where} order by tree_id, {order}"):
            trees = runs.get(r.get("run_id"))
            if trees is not None and r["tree_id"] in trees:
                getattr(trees[r["tree_id"]], name).append(r)
    for s in query(f"select {run}tree_id, node_ids from top_paths where {where}"):
        trees = runs.get(s.get("run_id"))
        if trees is not None and s["tree_id"] in trees:
            trees[s["tree_id"]].on_path |= set(s["node_ids"])
    return {run: dict(trees) for run, trees in runs.items()}


def tree_lines(rows: TreeRows) -> list[str]:
    """Lines drawing one tree: node, score, soft, tok, verdict, leaf reason, selected paths (``*``)."""
    creating, failed = rows.creating, rows.failed
    lines = []
    for n in rows.nodes:
        indent = "  " * n["depth"]
        mark = "*" if n["node_id"] in rows.on_path else " "
        parts = [f"{indent}{mark} {n['node_id']}", f"score {_num(n['score'])}", f"tok {n['tok']}"]
        if n["depth"]:
            edge = creating.get(n["node_id"], {})
            parts += [f"soft {_num(edge.get('soft'))}", edge.get("verdict")]
        if n["leaf_reason"]:
            parts.append(f"leaf: {n['leaf_reason']}")
        lines.append("  ".join(parts))
        lines += [f"{indent}    x {f['edge_id']} {f['verdict'] or 'in flight'}" for f in failed.get(n["node_id"], [])]
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
