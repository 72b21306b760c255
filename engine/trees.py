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


def tree_rows(query: Callable[[str], list[Row]], where: str) -> dict[str, TreeRows]:
    """The rows of every tree whose rows match ``where`` (an SQL condition on the views' columns), by tree id.

    ``query`` runs a read-only query: a run's catalog, or a collection of runs (then
    ``where`` names the run). A tree without nodes is absent.
    """
    trees: dict[str, TreeRows] = defaultdict(TreeRows)
    for n in query(f"select * from nodes where {where} order by tree_id, node_key(node_id)"):
        trees[n["tree_id"]].nodes.append(n)
    for name, order in (("edges", "started_seq"), ("turns", "edge_id, turn")):
        for r in query(f"select * from {name} where {where} order by tree_id, {order}"):
            if r["tree_id"] in trees:
                getattr(trees[r["tree_id"]], name).append(r)
    for s in query(f"select tree_id, node_ids from top_paths where {where}"):
        if s["tree_id"] in trees:
            trees[s["tree_id"]].on_path |= set(s["node_ids"])
    return dict(trees)


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
