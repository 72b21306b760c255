"""The view catalog: a DuckDB connection holding one or more runs' events and every view over them.

Six rooms: ``definitions`` (the ``views/*.sql`` files and their dependency order),
``tables`` (the log's events, one table per kind), ``refresh`` (keeping the
materialized views fresh), ``variables`` (the session variables and what each
makes stale), ``templates`` (this process's file of the empty catalog, which
later catalogs copy) and ``queries`` (SQL parsed by DuckDB: a user's query checked
read-only, and the relations a statement reads). :class:`Catalog` puts them together: it creates the macros and the
views in dependency order, takes events in (a whole log, or appended rows), and
answers queries after refreshing the tables they read.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog import templates
from engine.catalog.definitions import (
    VIEWS_DIR,
    ViewDef,
    load_graph,
    read_views,
    referenced_relations,
)
from engine.catalog.queries import QueryError as QueryError  # (the catalog's error)
from engine.catalog.queries import parse
from engine.catalog.variables import Variables
from ingest.errors import ViewBuildError
from ingest.text import sql_text

if TYPE_CHECKING:
    import pyarrow as pa

    from ingest.log import EventLog

# The event tables and their refresh need Arrow and the event schema: imported when a
# catalog is made, so that reading stored derived state (engine/derived/) loads neither.
_LAZY = {"KIND_COLUMNS": "engine.catalog.tables", "LOG_RELATIONS": "engine.catalog.tables"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "DECISION_THREADS",
    "KIND_COLUMNS",
    "LOG_RELATIONS",
    "Catalog",
    "QueryError",
    "ViewDef",
    "read_views",
    "view_sources",
]


# The threads of a catalog whose answers are recorded as decisions: one, so that every aggregate adds
# its floats in one fixed order and the same log records bit-identical scores (see Catalog.empty).
DECISION_THREADS = 1


def view_sources(con: duckdb.DuckDBPyConnection, view: ViewDef) -> set[str]:
    """The relations a view's SQL reads (views and base tables)."""
    return referenced_relations(con, view.sql, view.path)


class Catalog:
    """A DuckDB connection holding one run's events and every view over them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views_dir: Path = VIEWS_DIR, created: bool = False) -> None:
        """The catalog of ``con``'s current database; ``created``: it holds the definitions already (a copy)."""
        from engine.catalog.refresh import RefreshPlan
        from engine.catalog.tables import LogTables

        self.con = con
        self.log = LogTables(con, created)
        self.graph = load_graph(views_dir)
        if self.graph.macros_sql and not created:
            self._execute(self.graph.macros_path, self.graph.macros_sql)
        self.views = self.graph.views
        self.tables = self.graph.tables
        if not created:
            for name in self.graph.order:
                self._create(self.views[name])
        self.plan = RefreshPlan(con, self.graph, self._execute)
        self.variables = Variables(con, self.graph, self.plan.invalidate)
        self._defaults = {n: v for n, v in self.views.items() if v.defaults}
        self._needs: dict[str, list[str]] = {}  # sql -> the tables it reads (cache)

    def _create(self, view: ViewDef) -> None:
        comment = sql_text(view.summary)
        if view.materialized:
            self._execute(view.path, f"create table {view.name} as select * from ({view.sql}) limit 0")
            self.con.execute(f"comment on table {view.name} is {comment}")
        else:
            self._execute(view.path, f"create or replace view {view.name} as\n{view.sql}")
            self.con.execute(f"comment on view {view.name} is {comment}")

    def _execute(self, path: Path, sql: str) -> None:
        try:
            self.con.execute(sql)
        except duckdb.Error as err:
            raise ViewBuildError(f"{path}: {err}") from err

    # -- construction

    @classmethod
    def empty(cls, views_dir: Path = VIEWS_DIR, threads: int | None = None) -> Catalog:
        """A catalog over an empty log.

        ``threads=1`` makes every aggregate add its floats in one fixed order, so a
        live engine records bit-identical scores from run to run (parallel
        aggregation may differ in the last bit; comparisons allow 1e-9 for that).
        A later catalog of the same views in this process is copied from a file of the
        first (``templates``): binding every view again costs ~0.5-1 s, the copy ~50 ms.
        """
        config = {"threads": threads} if threads else {}
        graph = load_graph(views_dir)
        con = templates.connect(graph, config)
        if con is not None:
            return cls(con, views_dir, created=True)
        catalog = cls(duckdb.connect(config=config), views_dir)
        templates.keep(catalog.con, graph)
        return catalog

    @classmethod
    def inside(cls, con: duckdb.DuckDBPyConnection, database: str, views_dir: Path = VIEWS_DIR) -> Catalog:
        """A catalog in a new in-memory database ``database`` of ``con``, on a cursor of its own.

        Several catalogs then share one DuckDB instance (a collection of runs): each one's
        views bind to its own database, whoever queries them. The definitions are
        copied from a template database the instance makes once: creating the views
        binds each one (~0.4 s), a copy of them takes ~10 ms.
        """
        template = _template(con, views_dir)
        cursor = con.cursor()
        cursor.execute(f"attach ':memory:' as \"{database}\"")
        cursor.execute(f'copy from database "{template}" to "{database}"')
        cursor.execute(f'use "{database}"')
        catalog = cls(cursor, views_dir, created=True)
        catalog._database = database
        return catalog

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop what the catalog holds: the database :meth:`inside` made (a catalog of its own
        connection is dropped with it), and its cursor."""
        database = getattr(self, "_database", None)
        with contextlib.suppress(duckdb.Error):
            if database is not None:
                self.con.execute("use memory")
                self.con.execute(f'detach database if exists "{database}"')
            self.con.close()

    @staticmethod
    def template(con: duckdb.DuckDBPyConnection, views_dir: Path = VIEWS_DIR) -> str:
        """The database of ``con``'s instance holding the empty catalog :meth:`inside` copies (made on first use)."""
        return _template(con, views_dir)

    @classmethod
    def for_log(cls, log: EventLog, views_dir: Path = VIEWS_DIR, threads: int | None = None) -> Catalog:
        """A catalog holding the published prefix of ``log``."""
        catalog = cls.empty(views_dir, threads)
        catalog.load(log)
        return catalog

    # -- events in

    def load(self, log: EventLog, upto: int | None = None) -> None:
        """Add the published events of ``log`` the catalog does not hold yet (read from its parts),
        up to seq ``upto`` when given.

        A first load recomputes every table when read; a later one (a log that grew
        meanwhile: ``watch``) only the trees its events concern.
        """
        self.load_runs([(log, upto)])

    def load_runs(self, logs: list[tuple[EventLog, int | None]]) -> None:
        """:meth:`load` of several runs' logs (each up to its seq, when given), in one scan of their parts."""
        from engine.catalog.tables import KIND_COLUMNS

        self._apply_incoming()
        wanted = [(log, self.log.tail_seq(log.run_id), upto) for log, upto in logs]
        arrivals = self.log.load(wanted, self.variables.scoped)
        if not arrivals:
            return
        if any(tail == 0 for _, tail, _ in wanted):
            self.plan.invalidate(set(self.tables))
            self._set_defaults(set(KIND_COLUMNS))
        else:
            self.plan.arrived(arrivals)
            self._set_defaults(set(arrivals))

    def restore(
        self,
        logs: list[tuple[EventLog, int]],
        tables: dict[str, list[Path]],
        values: dict[str, Any],
        explicit: set[str],
        in_place: bool = False,
    ) -> None:
        """Hold stored states of an empty catalog: the events of each ``(log, upto)`` up to its seq (the
        facts) and each materialized table's rows from its files (a state's each, derived from them, checked
        by the caller), under the variables they were derived with (the same for every state); nothing is
        stale.

        The events are loaded from the log's parts, each checked against its checksum; or,
        ``in_place``, read where they lie: each event table becomes a view over the parts (and
        each materialized table a view over its files), typed as the tables are - a catalog
        to read views from (their rows stored), never to take events in. ``tables`` names
        the files of every materialized table (ValueError otherwise).
        """
        if self.tail_seq() or set(tables) != set(self.tables):
            raise ValueError("restore needs an empty catalog and a file for every materialized table")
        rows = {name: f"read_parquet([{', '.join(sql_text(f) for f in tables[name])}])" for name in self.tables}
        if in_place:
            relations = self.log.read_in_place(logs) | {name: (rows[name], None) for name in self.tables}
            self.con.execute(self.log.typed_views(relations))
        else:
            self.log.load([(log, 0, upto) for log, upto in logs], self.variables.scoped)
            for name in self.tables:
                self._execute(self.views[name].path, f"insert into {name} by name select * from {rows[name]}")
        self.variables.restore(values, explicit)

    def insert(self, table: pa.Table) -> None:
        """Mirror appended events (any superset of the light columns); applied before the next query."""
        self.log.insert(table)

    def _apply_incoming(self) -> None:
        arrivals = self.log.apply()
        if arrivals:
            self.plan.arrived(arrivals)
            self._set_defaults(set(arrivals))

    def _set_defaults(self, kinds: set[str]) -> None:
        """Set the variables whose defaults come from views reading these kinds."""
        for view in self._defaults.values():
            if not self.kinds_read(view.name) & kinds:
                continue
            rows = self.con.execute(f"select * from ({view.sql})").fetchall()
            names = [d[0] for d in self.con.description]
            row = dict(zip(names, rows[0], strict=True)) if rows else {}
            for var, column in view.defaults.items():
                if row.get(column) is not None:
                    self.variables.set_default(var, row[column])

    # -- reading

    def refresh(self, tables: list[str] | None = None) -> None:
        """Recompute the materialized rows that arrived events or variables made stale."""
        self._apply_incoming()
        self.plan.refresh(tables, self.variables.scoped)

    def stale(self) -> dict[str, list[str]]:
        """The trees whose rows each materialized table will recompute before use."""
        self._apply_incoming()
        return self.plan.stale()

    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts (the materialized views it reads refreshed first)."""
        cur = self.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def execute(self, sql: str, params: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run ``sql`` once the tables it reads are fresh; QueryError names a failure."""
        self.refresh(self._tables_needed(sql))
        try:
            return self.con.execute(sql, params or [])
        except duckdb.Error as err:
            raise QueryError(f"{err} (in: {' '.join(sql.split())[:200]})") from err

    def _tables_needed(self, sql: str) -> list[str]:
        """The materialized tables a query reads, directly or through views."""
        if sql not in self._needs:
            parsed = parse(self.con, sql)
            seen = self.graph.reached(set(self.views) if isinstance(parsed, str) else set(parsed.relations))
            self._needs[sql] = [n for n in self.tables if n in seen]
        return self._needs[sql]

    def kinds_read(self, view: str) -> set[str]:
        """The event kinds a view reads, directly or through other views.

        Its rows at a log prefix change only when an event of one of these kinds is
        added (a later tail moves the "now" point of the tree views, not the state
        at it: every view filters events by seq).
        """
        from engine.catalog.tables import KIND_COLUMNS

        read = self.graph.relations_read(view)
        if "event_log" in read:
            return set(KIND_COLUMNS)
        return {k for k in KIND_COLUMNS if f"log_{k}" in read}

    def tail_seq(self, run_id: str | None = None) -> int:
        """The largest seq the catalog holds (of ``run_id``'s events when given; 0 when none)."""
        self._apply_incoming()
        return self.log.tail_seq(run_id)


def sandbox(con: duckdb.DuckDBPyConnection, dirs: Iterable[Path]) -> None:
    """Let ``con``'s instance touch files under ``dirs`` only, for good (DuckDB's allowed directories with
    external access off: no other file read or written, no extension, no network). Every connection that
    evaluates views over a data directory has it, as users' queries do."""
    con.execute("set allowed_directories = ?", [[f"{Path(d).resolve()}/" for d in dirs]])
    con.execute("set enable_external_access = false")


def template_name(views_dir: Path) -> str:
    """The name of the database an instance holds the empty catalog of ``views_dir`` in (one attached under
    it is used as it is)."""
    return "catalog_template_" + hashlib.sha256(str(views_dir.resolve()).encode()).hexdigest()[:12]


def _template(con: duckdb.DuckDBPyConnection, views_dir: Path) -> str:
    """The database of ``con``'s instance holding the empty catalog of ``views_dir`` (made on first use)."""
    name = template_name(views_dir)
    if not con.execute("select 1 from duckdb_databases() where database_name = ?", [name]).fetchall():
        cursor = con.cursor()
        cursor.execute(f"attach ':memory:' as \"{name}\"")
        cursor.execute(f'use "{name}"')
        Catalog(cursor, views_dir)
        cursor.close()
    return name
