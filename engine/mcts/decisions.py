"""The engine's decisions as pure functions: rows of the views in, events out (ALGORITHM §2).

Every rule lives in a view: ``int_trees__stopping`` (stops due), ``int_edges__open``
(the skip or verdict an edge needs), ``int_next_work`` (the starts each tree has
due) and ``int_rotation`` (the round-robin order of the trees). These functions
only turn those rows into events, and :class:`RoundRobin` hands free slots out.
"""

from __future__ import annotations

from typing import Any

from ingest.errors import LogError
from ingest.events import EdgeJudged, EdgeStarted, Event, NodeSelected, TreeStopped, TurnSkipped

Row = dict[str, Any]
SKIP_REASON = "turn 1 returned no score and the edge can no longer be kept"


class JudgedTooEarlyError(LogError):
    """An edge is due for a verdict that its facts do not give (a forged or damaged log)."""


def stops(rows: list[Row]) -> list[TreeStopped]:
    """A TreeStopped per ``int_trees__stopping`` row, at the prefix the condition was read."""
    return [TreeStopped(watermark=r["asof_seq"], tree_id=r["tree_id"], reason=r["stop_reason"]) for r in rows]


def skips(open_edges: list[Row], watermark: int) -> list[TurnSkipped]:
    """The turn-2 skips due among ``int_edges__open`` rows."""
    return [
        TurnSkipped(watermark=watermark, tree_id=r["tree_id"], edge_id=r["edge_id"], turn=2, reason=SKIP_REASON)
        for r in open_edges
        if r["next_step"] == "skip_turn_2"
    ]


def verdicts(open_edges: list[Row], watermark: int) -> list[EdgeJudged]:
    """The verdicts due among ``int_edges__open`` rows."""
    due = [r for r in open_edges if r["next_step"] == "judge"]
    for r in due:
        if r["verdict"] is None:
            raise JudgedTooEarlyError(f"{r['edge_id']}: due for a verdict the facts do not give")
    return [
        EdgeJudged(
            watermark=watermark,
            tree_id=r["tree_id"],
            edge_id=r["edge_id"],
            verdict=r["verdict"],
            child_id=r["child_id"],
        )
        for r in due
    ]


def start(work: Row) -> list[Event]:
    """The events of starting an ``int_next_work`` row: its selection (if any), then the edge."""
    events: list[Event] = []
    if work["kind"] == "select":
        events.append(
            NodeSelected(
                watermark=work["asof_seq"],
                tree_id=work["tree_id"],
                node_id=work["parent_id"],
                select_score=work["select_score"],
                q=work["q"],
                t=work["t"],
            )
        )
    events.append(
        EdgeStarted(
            tree_id=work["tree_id"],
            edge_id=work["edge_id"],
            parent_id=work["parent_id"],
            slot=work["slot"],
            attempt=work["attempt"],
        )
    )
    return events


class RoundRobin:
    """Free slots handed to the trees in turn (ALGORITHM §2), from the rows of the views.

    ``order`` is every tree in ``int_rotation`` order, ``work`` each tree's
    ``int_next_work`` rows in pick order. A visit takes a tree's leading root
    directions (they start in consecutive slots) and then at most one other start.
    After a tree starts its Select winner, or before it starts one that follows
    another start, its rows are stale: :meth:`next` returns the trees to ask again
    (their selection must be read, and recorded, with the starts before it in view).
    """

    def __init__(self, order: list[str], work: dict[str, list[Row]], free: int) -> None:
        self.order = order
        self.work = {tree: list(rows) for tree, rows in work.items()}
        self.free = free
        self.stale: set[str] = set()
        self._at = 0
        self._idle = 0

    def next(self) -> Row | set[str] | None:
        """The next row to start, the trees to ask again first, or None when done."""
        n = len(self.order)
        while self.free > 0 and self._idle < n:
            tree = self.order[self._at % n]
            if tree in self.stale:
                return set(self.stale)
            rows = self.work.get(tree)
            if not rows:
                self._idle += 1
                self._at += 1
                continue
            row = rows.pop(0)
            self.free -= 1
            self._idle = 0
            if row["kind"] == "select" or (rows and rows[0]["kind"] == "select"):
                self.stale.add(tree)
            if row["kind"] != "fanout":
                self._at += 1
            return row
        return None

    def update(self, work: dict[str, list[Row]]) -> None:
        """The stale trees' rows, asked again."""
        for tree in self.stale:
            self.work[tree] = list(work.get(tree, []))
        self.stale.clear()
