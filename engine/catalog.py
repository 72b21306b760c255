"""The view catalog: ``views/*.sql`` loaded in dependency order over a run's log.

Each file holds one bare ``select`` whose name is the file's stem, after a header::

    -- One row per node: depth, score, Q and leaf reason (SPEC §2).
    -- grain: tree_id, node_id
    -- sources: int_nodes__asof, run_config
    --
    -- Optional notes.

The base relation is the table ``event_log`` (the light columns of every event);
the view ``events`` is its prefix up to the variable ``watermark`` (all of it when
unset), and only ``stg_*`` views read ``events``. ``_macros.sql`` defines the
shared SQL macros (such as ``pct``) before any view is created.
"""

from __future__ import annotations

import graphlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ingest.errors import ViewBuildError, ViewNotFoundError
from ingest.events import LIGHT_SCHEMA
from ingest.log import EventLog

VIEWS_DIR = Path(__file__).resolve().parent.parent / "views"
MACROS_FILE = "_macros.sql"
MAX_SEQ = 9223372036854775807


@dataclass(frozen=True)
class ViewDef:
    """One view file: its name, header and body."""

    name: str
    path: Path
    summary: str
    grain: tuple[str, ...]
    sources: tuple[str, ...]
    notes: str
    sql: str


def _parse_header(path: Path, text: str) -> tuple[str, tuple[str, ...], tuple[str, ...], str]:
    lines = text.splitlines()
    header = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line[2:].strip())
    fields: dict[str, str] = {}
    notes = []
    for line in header[1:]:
        m = re.match(r"^(grain|sources):\s*(.*)$", line)
        if m:
            fields[m[1]] = m[2]
        elif line:
            notes.append(line)
    if not header or not header[0] or "grain" not in fields or "sources" not in fields:
        msg = (
            f"{path}: the header must start with '-- <what it derives>' and have "
            "'-- grain: <columns>' and '-- sources: <relations>' lines"
        )
        raise ViewBuildError(msg)
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    return header[0], split(fields["grain"]), split(fields["sources"]), "\n".join(notes)


def read_views(views_dir: Path = VIEWS_DIR) -> dict[str, ViewDef]:
    """Parse every view file of ``views_dir``."""
    views = {}
    for path in sorted(views_dir.glob("*.sql")):
        if path.name.startswith("_"):
            continue
        text = path.read_text()
        summary, grain, sources, notes = _parse_header(path, text)
        views[path.stem] = ViewDef(path.stem, path, summary, grain, sources, notes, text)
    return views


def _referenced_tables(con: duckdb.DuckDBPyConnection, view: ViewDef) -> set[str]:
    raw = con.execute("select json_serialize_sql(?)", [view.sql]).fetchone()[0]
    tree = json.loads(raw)
    if tree.get("error"):
        msg = f"{view.path}: {tree.get('error_message', 'cannot parse the SQL')}"
        raise ViewBuildError(msg)
    tables: set[str] = set()
    ctes: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE" and "table_name" in node:
                tables.add(node["table_name"])
            cte_map = node.get("cte_map")
            if isinstance(cte_map, dict):
                for entry in cte_map.get("map", []):
                    ctes.add(entry.get("key"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return tables - ctes


def dependency_order(con: duckdb.DuckDBPyConnection, views: dict[str, ViewDef]) -> list[str]:
    """View names ordered so that every view comes after the views it reads."""
    graph = {}
    for name, view in views.items():
        deps = _referenced_tables(con, view) & set(views)
        if name in deps:
            raise ViewBuildError(f"{view.path}: the view reads itself")
        graph[name] = deps
    try:
        return list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        cycle = " -> ".join(err.args[1])
        raise ViewBuildError(f"views/ has a dependency cycle: {cycle}") from err


def view_sources(con: duckdb.DuckDBPyConnection, view: ViewDef) -> set[str]:
    """The relations a view's SQL reads (views and base tables)."""
    return _referenced_tables(con, view)


class Catalog:
    """A DuckDB connection holding one run's events and every view over them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views_dir: Path = VIEWS_DIR) -> None:
        self.con = con
        self.views = read_views(views_dir)
        self._create_base_table()
        macros = views_dir / MACROS_FILE
        if macros.exists():
            self._execute(macros, macros.read_text())
        for name in dependency_order(con, self.views):
            view = self.views[name]
            self._execute(view.path, f"create or replace view {name} as\n{view.sql}")
            comment = view.summary.replace("'", "''")
            con.execute(f"comment on view {name} is '{comment}'")

    # -- construction

    @classmethod
    def empty(cls, views_dir: Path = VIEWS_DIR) -> Catalog:
        """A catalog over an empty log."""
        return cls(duckdb.connect(), views_dir)

    @classmethod
    def for_log(cls, log: EventLog, views_dir: Path = VIEWS_DIR) -> Catalog:
        """A catalog holding the published prefix of ``log``."""
        catalog = cls.empty(views_dir)
        catalog.insert(log.read_table(LIGHT_SCHEMA.names))
        return catalog

    def _create_base_table(self) -> None:
        empty = LIGHT_SCHEMA.empty_table()  # noqa: F841 - read by DuckDB's replacement scan
        self.con.execute("create table event_log as select * from empty")

    def _execute(self, path: Path, sql: str) -> None:
        try:
            self.con.execute(sql)
        except duckdb.Error as err:
            raise ViewBuildError(f"{path}: {err}") from err

    # -- data

    def insert(self, table: pa.Table) -> None:
        """Mirror appended events (any superset of the light columns)."""
        if table.num_rows == 0:
            return
        light = table.select(LIGHT_SCHEMA.names)
        self.con.register("_incoming", light)
        try:
            self.con.execute("insert into event_log select * from _incoming")
        finally:
            self.con.unregister("_incoming")

    def set_watermark(self, seq: int | None) -> None:
        """Make every view see only events with ``seq <= seq`` (None: all of them)."""
        if seq is None:
            self.con.execute("reset variable watermark")
        else:
            self.con.execute("set variable watermark = ?", [int(seq)])

    def set_points(self, mode: str) -> None:
        """Choose the as-of points of the tree views: 'now' or 'decisions' (replay)."""
        if mode not in ("now", "decisions"):
            raise ValueError(mode)
        self.con.execute("set variable asof_points = ?", [mode])

    # -- reading

    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts."""
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def rows(
        self, view: str, where: str = "", params: list[Any] | None = None, order: str = ""
    ) -> list[dict[str, Any]]:
        """Rows of one view, optionally filtered and ordered."""
        self.require_view(view)
        sql = f"select * from {view}"
        if where:
            sql += f" where {where}"
        if order:
            sql += f" order by {order}"
        return self.query(sql, params)

    def require_view(self, name: str) -> ViewDef:
        """The definition of ``name``, or ViewNotFoundError with a suggestion."""
        if name in self.views:
            return self.views[name]
        import difflib

        close = difflib.get_close_matches(name, list(self.views), n=1)
        hint = f" - did you mean {close[0]!r}?" if close else ""
        msg = f"view {name!r} does not exist{hint} ('python cli.py views' lists them)"
        raise ViewNotFoundError(msg)

    def tail_seq(self) -> int:
        """The largest seq the catalog holds (0 when empty)."""
        return self.con.execute("select coalesce(max(seq), 0) from event_log").fetchone()[0]
