"""Keeping materialized views fresh: which trees' rows each table must recompute.

DuckDB inlines a view at every reference, so a DAG with diamonds plans in seconds;
a view marked ``materialized: table`` is instead a table holding its ``select``'s
rows. Events that arrive for a tree make that tree's rows of every tree-scoped
table (grain starting with ``run_id, tree_id``) that reads their kind stale, and so the
tables downstream of those; a query first recomputes the stale rows of the tables
it reads, in dependency order. After a load, or a variable a table reads changing,
the table is recomputed whole when next read (so are tables whose grain has no
``tree_id``, such as ``run_config``). The SQL stays the one definition either way.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from engine.catalog.definitions import ViewDef, ViewGraph
from engine.catalog.tables import KIND_COLUMNS, Arrivals
from ingest.errors import ViewBuildError
from ingest.text import sql_text

NOW = "stg_log_tail"  # the view of each run's last seq: "now" for the tree views

# Optimizers that cost more planning time than they save on a few trees' rows.
# CTE inlining and the CTE filter pusher stay on: without them a CTE is computed
# for every tree and filtered afterwards (measured on a 300-tree log: the refresh
# chain 168 -> 117 ms for 4 trees).
SMALL_REFRESH_OFF = (
    "join_order,statistics_propagation,common_subplan,"
    "build_side_probe_side,top_n_window_elimination,late_materialization,row_group_pruner,"
    "common_subexpressions,projection_pullup,duplicate_groups"
)


def read_through_views(graph: ViewGraph, name: str) -> set[str]:
    """The relations a view's rows are computed from: what it reads, through views but not through tables."""
    read, seen, todo = set(), set(), list(graph.reads[name])
    while todo:
        dep = todo.pop()
        if dep in seen:
            continue
        seen.add(dep)
        read.add(dep)
        if dep in graph.reads and dep not in graph.tables:
            todo.extend(graph.reads[dep])
    return read


def event_kinds(graph: ViewGraph, name: str) -> set[str]:
    """The event kinds a view's rows derive from (through views, not through tables).

    Decisions count as facts do: tree state derives from facts, but evaluated at every
    decision (``asof_points = 'decisions'``) each decision is a point of its tree (a
    path selection: of every tree), so a catalog that takes one in - a stored state
    caught up across it - must recompute what it evaluates there.
    """
    return {dep[4:] for dep in read_through_views(graph, name) if dep.startswith("log_") and dep[4:] in KIND_COLUMNS}


class RefreshPlan:
    """The stale rows of every materialized table, and the statements that renew them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, graph: ViewGraph, execute: Callable) -> None:
        self.con = con
        self.graph = graph
        self._execute = execute
        self.tables = graph.tables
        self._check_whole_run_tables()
        self.kinds = {n: event_kinds(graph, n) for n in self.tables}
        upstream = {n: {t for t in self.tables if t != n and t in graph.reached(graph.reads[n])} for n in self.tables}
        self.downstream = {n: {d for d in self.tables if n in upstream[d]} for n in self.tables}
        # Tables holding "now" (they read the log's tail): a tree's rows are as of when they were computed, so
        # they are computed again whenever a table reading them is (as if that table's SQL held theirs).
        self.now_tables = {n for n in self.tables if NOW in read_through_views(graph, n)}
        self._whole: set[str] = set()  # tables to recompute whole (all trees)
        self._stale: dict[str, set[str]] = {n: set() for n in self.tables}  # table -> trees
        # Whether a refresh of a few trees turns optimizers off (a setting): a collection
        # turns it off before it locks its configuration, which then refuses every setting.
        self.tune_optimizers = True

    def _check_whole_run_tables(self) -> None:
        """A whole-run table must not read tree data: it is not refreshed tree by tree."""
        tree_tables = {n for n in self.tables if self.graph.views[n].tree_scoped}
        for name in self.tables:
            if self.graph.views[name].tree_scoped:
                continue
            for dep in sorted(self.graph.relations_read(name) & tree_tables):
                msg = f"{self.graph.views[name].path}: a whole-run table cannot read tree table {dep}"
                raise ViewBuildError(msg)

    # -- what became stale

    def arrived(self, arrivals: Arrivals) -> None:
        """Events arrived: the trees they concern are stale in the tables reading their kinds."""
        whole = set()
        for name in self.tables:
            trees = set().union(*(arrivals[k] for k in self.kinds[name] & set(arrivals)))
            if None in trees or (trees and not self.graph.views[name].tree_scoped):
                whole.add(name)
            else:
                self._stale[name] |= trees  # type: ignore[arg-type]
        self.invalidate(whole)

    def invalidate(self, tables: set[str]) -> None:
        """These tables, and every table that reads them, are recomputed whole when read."""
        todo = list(tables)
        while todo:
            name = todo.pop()
            if name not in self._whole:
                self._whole.add(name)
                todo.extend(self.downstream[name])

    def stale(self) -> dict[str, list[str]]:
        """The trees whose rows each table will recompute before use (``*``: all)."""
        out = {n: sorted(trees) for n, trees in self._stale.items() if trees}
        return out | {n: ["*"] for n in self._whole}

    # -- renewing

    def refresh(self, tables: list[str] | None, scoped: Callable) -> None:
        """Recompute the stale rows of ``tables`` (all: None), in dependency order.

        What reads a table marked whole is marked whole too (see :meth:`invalidate`).
        """
        wanted = [n for n in self.tables if tables is None or n in tables]
        self._follow_now(wanted)
        if self._whole.isdisjoint(wanted):
            self._refresh_trees(wanted, scoped)
            return
        for name in wanted:
            if name in self._whole:
                view = self.graph.views[name]
                self._execute(view.path, f"delete from {name}")
                self._execute(view.path, f"insert into {name} select * from ({view.sql})")
                self._stale[name].clear()
                self._whole.discard(name)
            else:
                self._refresh_trees([name], scoped)

    def _follow_now(self, wanted: list[str]) -> None:
        """A table holding "now" is stale wherever a table reading it (among ``wanted``) is or will be (made
        stale by a table it reads)."""
        for name in self.now_tables & set(wanted):
            readers = self.downstream[name] & set(wanted)
            if readers & self._whole:
                self._whole.add(name)
                continue
            feeders = {u for u in wanted if u in readers or self.downstream[u] & readers}
            self._stale[name] |= set().union(*(self._stale[u] for u in feeders))

    def _refresh_trees(self, wanted: list[str], scoped: Callable) -> None:
        if not any(self._stale[n] for n in wanted):
            return
        # Trees that upstream tables make stale are among these, so the scope holds.
        scope = sorted(set().union(*(self._stale[n] for n in wanted)))
        # A few trees' rows are small: planning dominates, and these optimizers
        # cost more than they save there (measured: a quarter of the refresh time).
        if self.tune_optimizers:
            self.con.execute(f"set disabled_optimizers = {sql_text(SMALL_REFRESH_OFF)}")
        try:
            with scoped(refresh_trees=scope):
                for name in wanted:
                    self._refresh_table(self.graph.views[name])
        finally:
            if self.tune_optimizers:
                self.con.execute("reset disabled_optimizers")

    def _refresh_table(self, view: ViewDef) -> None:
        trees = self._stale[view.name]
        if not trees:  # became stale through an upstream table refreshed just now
            return
        listed = ", ".join(sql_text(t) for t in sorted(trees))
        self._execute(view.path, f"delete from {view.name} where tree_id in ({listed})")
        self._execute(view.path, f"insert into {view.name} select * from ({view.sql}) where tree_id in ({listed})")
        for down in self.downstream[view.name]:
            self._stale[down] |= trees
        self._stale[view.name] = set()
