"""The view catalog: ``views/*.sql`` loaded in dependency order over a run's log.

Each file holds one bare ``select`` whose name is the file's stem, after a header::

    -- One row per node: depth, score, Q and leaf reason (SPEC §2).
    -- grain: tree_id, node_id
    -- sources: int_nodes__asof, run_config
    -- materialized: table
    --
    -- Optional notes.

Views are DuckDB views unless marked ``materialized: table`` (dbt's idea): DuckDB
inlines a view at every reference, so a DAG with diamonds plans in seconds; a
materialized view is a table holding the result of its ``select``. The catalog
keeps tables fresh itself: inserting events marks the trees they concern as
dirty, and every query first re-computes the dirty trees' rows of each
tree-scoped table (grain starting with ``tree_id``) it reads, in dependency order.
After a load, a new watermark or new as-of points, a table is recomputed whole
when a query next reads it (so are tables whose grain has no ``tree_id``, such as
``run_config``, when the run config changes). The SQL stays the one definition
either way.

The catalog keeps the light columns of every event in one table per kind,
``log_<kind>`` (only that kind's columns, so a staging view scans only its own
kind), and the view ``event_log`` is their union. Only ``stg_*`` views read them;
each filters with the macros ``in_prefix(seq)`` (the prefix up to the variable
``watermark``, all events when unset) and ``in_scope(tree_id)``. ``_macros.sql``
defines the shared SQL macros (such as ``pct``) before any view is created.
"""

from __future__ import annotations

import contextlib
import graphlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import regex_problem
from ingest.errors import LogError, ViewBuildError, ViewNotFoundError
from ingest.events import DECISION_KINDS, ENVELOPE, EVENT_TYPES, LIGHT_SCHEMA
from ingest.log import EventLog, part_schema

VIEWS_DIR = Path(__file__).resolve().parent.parent / "views"
MACROS_FILE = "_macros.sql"
MAX_SEQ = 9223372036854775807
# Optimizers that cost more planning time than they save on a few trees' rows.
# CTE inlining and the CTE filter pusher stay on: without them a CTE is computed
# for every tree and filtered afterwards (measured on a 300-tree log: the refresh
# chain 168 -> 117 ms for 4 trees).
SMALL_REFRESH_OFF = (
    "join_order,statistics_propagation,common_subplan,"
    "build_side_probe_side,top_n_window_elimination,late_materialization,row_group_pruner,"
    "common_subexpressions,projection_pullup,duplicate_groups"
)


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
    materialized: bool = False

    @property
    def tree_scoped(self) -> bool:
        """Whether rows belong to one tree each (refreshable tree by tree)."""
        return bool(self.grain) and self.grain[0] == "tree_id"


def _parse_header(
    path: Path, text: str
) -> tuple[str, tuple[str, ...], tuple[str, ...], str, bool]:
    lines = text.splitlines()
    header = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line[2:].strip())
    fields: dict[str, str] = {}
    notes = []
    for line in header[1:]:
        m = re.match(r"^(grain|sources|materialized):\s*(.*)$", line)
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
    if fields.get("materialized", "table") != "table":
        raise ViewBuildError(f"{path}: 'materialized' can only be 'table'")
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    return (
        header[0], split(fields["grain"]), split(fields["sources"]), "\n".join(notes),
        "materialized" in fields,
    )  # fmt: skip


def read_views(views_dir: Path = VIEWS_DIR) -> dict[str, ViewDef]:
    """Parse every view file of ``views_dir``."""
    views = {}
    for path in sorted(views_dir.glob("*.sql")):
        if path.name.startswith("_"):
            continue
        text = path.read_text()
        summary, grain, sources, notes, materialized = _parse_header(path, text)
        views[path.stem] = ViewDef(
            path.stem, path, summary, grain, sources, notes, text, materialized
        )
    return views


def _referenced_tables(con: duckdb.DuckDBPyConnection, view: ViewDef) -> set[str]:
    raw = con.execute("select json_serialize_sql(?)", [view.sql]).fetchall()[0][0]
    tree = json.loads(raw)
    if tree.get("error"):
        msg = f"{view.path}: {tree.get('error_message', 'cannot parse the SQL')}"
        raise ViewBuildError(msg)
    return _base_tables(tree)


def _base_tables(tree: Any) -> set[str]:
    """Relation names a serialized statement reads, minus its own CTE names."""
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


def dependency_order(views: dict[str, ViewDef], reads: dict[str, set[str]]) -> list[str]:
    """View names ordered so that every view comes after the views it reads."""
    graph = {}
    for name, view in views.items():
        deps = reads[name] & set(views)
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
        # What every view reads: its declared sources (tests/test_views.py checks
        # that they are exactly what its SQL reads; parsing 50 views costs 0.2 s).
        self._reads = {n: set(v.sources) for n, v in self.views.items()}
        self.order = dependency_order(self.views, self._reads)
        self.tables = [n for n in self.order if self.views[n].materialized]
        self._check_materialized()
        for name in self.order:
            view = self.views[name]
            comment = view.summary.replace("'", "''")
            if view.materialized:
                self._execute(view.path, f"create table {name} as select * from ({view.sql}) limit 0")
                con.execute(f"comment on table {name} is '{comment}'")
            else:
                self._execute(view.path, f"create or replace view {name} as\n{view.sql}")
                con.execute(f"comment on view {name} is '{comment}'")
        self._whole: set[str] = set()  # tables to re-compute whole (all trees)
        self._incoming: list[pa.Table] = []
        self._plan_refresh()
        self._stale: dict[str, set[str]] = {n: set() for n in self.tables}  # table -> trees
        self._needs: dict[str, list[str]] = {}  # sql -> tables it reads (cache)

    def _plan_refresh(self) -> None:
        """For each tree table: the event kinds and the tables it reads (through views)."""
        reads = self._reads
        self._kinds: dict[str, set[str]] = {}
        self._upstream: dict[str, set[str]] = {}
        for name in self.tables:
            kinds, ups, seen, todo = set(), set(), set(), list(reads[name])
            while todo:
                dep = todo.pop()
                if dep in seen:
                    continue
                seen.add(dep)
                if dep in self.tables:
                    ups.add(dep)
                elif dep.startswith("stg_") and dep != "stg_log_tail":
                    # Tree state derives from facts; decisions only matter as the
                    # evaluation points of replay, which refreshes everything.
                    if dep[4:] not in DECISION_KINDS:
                        kinds.add(dep[4:])
                    continue
                if dep in reads and dep not in self.tables:
                    todo.extend(reads[dep])
            self._kinds[name], self._upstream[name] = kinds, ups
        self._downstream = {n: {d for d in self.tables if n in self._upstream[d]} for n in self.tables}

    def _check_materialized(self) -> None:
        """A whole-run table must not read tree data: it is not refreshed tree by tree."""
        tree_tables = {n for n in self.tables if self.views[n].tree_scoped}
        reads = self._reads
        for name in self.tables:
            if self.views[name].tree_scoped:
                continue
            seen, todo = set(), list(reads[name])
            while todo:
                dep = todo.pop()
                if dep in tree_tables:
                    msg = f"{self.views[name].path}: a whole-run table cannot read tree table {dep}"
                    raise ViewBuildError(msg)
                if dep in reads and dep not in seen:
                    seen.add(dep)
                    todo.extend(reads[dep])

    # -- construction

    @classmethod
    def empty(cls, views_dir: Path = VIEWS_DIR, threads: int | None = None) -> Catalog:
        """A catalog over an empty log.

        ``threads=1`` makes every aggregate add its floats in one fixed order, so a
        live engine records bit-identical scores from run to run (parallel
        aggregation may differ in the last bit; comparisons allow 1e-9 for that).
        """
        con = duckdb.connect(config={"threads": threads} if threads else {})
        return cls(con, views_dir)

    @classmethod
    def for_log(cls, log: EventLog, views_dir: Path = VIEWS_DIR, threads: int | None = None) -> Catalog:
        """A catalog holding the published prefix of ``log``."""
        catalog = cls.empty(views_dir, threads)
        catalog.load(log)
        return catalog

    def load(self, log: EventLog, attempts: int = 50) -> None:
        """Insert the published events of ``log``, read by DuckDB from its Parquet parts.

        Each kind's table reads only its columns (no Arrow copy of the whole log in
        between). The parts are read in one transaction: when compaction replaced a
        part meanwhile, the load is rolled back and taken again from a new listing.
        """
        self._apply_incoming()
        for attempt in range(attempts):
            parts = log.parts()
            files = [str(p.path) for p in parts]
            if not files:
                return
            try:
                present = set().union(*(part_schema(p).names for p in parts))
                self._load_files(files, present)
            except (OSError, duckdb.Error) as err:
                if all(Path(f).exists() for f in files):
                    raise LogError(f"{self._unreadable(files, log)}: cannot read the log: {err}") from err
                time.sleep(0.002 * attempt)  # a part was compacted away: list again
                continue
            self._whole = set(self.tables)
            self._sync_knowledge_patterns(str(log.log_dir))
            return
        raise LogError(f"{log.log_dir}: parts kept disappearing while reading - try again")

    def _unreadable(self, files: list[str], log: EventLog) -> str:
        """The first part DuckDB cannot scan (else the log directory), for an error message.

        Hashing every column decodes every page (statistics cannot answer it), and the
        one-row answer makes any failure a ``duckdb.Error`` of ``execute`` (a streamed
        Arrow reader raised some as OSError, depending on when the scan failed).
        """
        for f in files:
            try:
                self.con.execute("select bit_xor(hash(columns(*))) from read_parquet(?)", [f])
            except duckdb.Error:
                return f
        return str(log.log_dir)

    def _load_files(self, files: list[str], present: set[str]) -> None:
        source = "read_parquet(getvariable('load_files'), union_by_name = true)"
        self.con.execute("set variable load_files = ?", [files])
        # Rows of a log table have no order (every view orders by seq where order
        # matters), so the parts may be copied in parallel (measured: load -20%).
        self.con.execute("set preserve_insertion_order = false")
        try:
            self.con.execute("begin transaction")
            kinds = {r[0] for r in self.con.execute(f"select distinct kind from {source}").fetchall()}
            self._insert_kinds(source, kinds, present)
            self.con.execute(f"update log_tail set seq = greatest(seq, (select max(seq) from {source}))")
            self.con.execute("commit")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("rollback")
            raise
        finally:
            self.con.execute("reset preserve_insertion_order")
            self.con.execute("reset variable load_files")

    def _create_base_table(self) -> None:
        for kind, names in KIND_COLUMNS.items():
            empty = pa.schema([LIGHT_SCHEMA.field(n) for n in names]).empty_table()  # noqa: F841
            self.con.execute(f"create table log_{kind} as select * from empty")
        union = "\nunion all by name\n".join(f"select * from log_{k}" for k in KIND_COLUMNS)
        self.con.execute(f"create view event_log as\n{union}")
        # The largest seq held, kept up to date by insert() (so "now" costs no scan).
        self.con.execute("create table log_tail as select cast(0 as bigint) as seq")

    def _execute(self, path: Path, sql: str) -> None:
        try:
            self.con.execute(sql)
        except duckdb.Error as err:
            raise ViewBuildError(f"{path}: {err}") from err

    # -- data

    def insert(self, table: pa.Table) -> None:
        """Mirror appended events (any superset of the light columns).

        Rows are buffered and written to the per-kind tables before the next query,
        so many small appends cost one insert per kind.
        """
        if table.num_rows:
            self._incoming.append(table)

    def _apply_incoming(self) -> None:
        if not self._incoming:
            return
        incoming = pa.concat_tables(self._incoming, promote_options="default")
        self._incoming = []
        present = set(incoming.column_names)
        keys = ["kind", "tree_id"] if "tree_id" in present else ["kind"]
        groups = incoming.group_by(keys, use_threads=False).aggregate([]).to_pylist()
        kinds = {g["kind"] for g in groups}
        self._insert_kinds(incoming, kinds, present)
        self.con.execute("update log_tail set seq = greatest(seq, ?)", [pc.max(incoming.column("seq")).as_py()])
        if "run_started" in kinds:
            self._whole = set(self.tables)
            self._sync_knowledge_patterns("the inserted RunStarted event")
            return
        trees_by_kind: dict[str, set[str]] = {}
        for g in groups:
            if g.get("tree_id") is not None:
                trees_by_kind.setdefault(g["kind"], set()).add(g["tree_id"])
        for name in self.tables:
            for kind in self._kinds[name] & set(trees_by_kind):
                self._stale[name] |= trees_by_kind[kind]

    def _insert_kinds(self, source: str | pa.Table, kinds: set[str], present: set[str]) -> None:
        """Copy the events of ``source`` (SQL relation or Arrow table) into their kinds' tables.

        Only the columns ``present`` in the source are read (absent ones are null);
        kinds this version does not know are left out. An Arrow table is read by name
        from this frame (DuckDB's replacement scan: twice as fast as a registered view).
        """
        incoming = source if isinstance(source, pa.Table) else None  # noqa: F841 - read by DuckDB
        relation = "incoming" if isinstance(source, pa.Table) else source
        for kind in sorted(kinds & set(KIND_COLUMNS)):
            cols = ", ".join(f'"{c}"' for c in KIND_COLUMNS[kind] if c in present)
            sql = f"insert into log_{kind} by name select {cols} from {relation} where kind = ?"
            self.con.execute(sql, [kind])

    def refresh(self, tables: list[str] | None = None) -> None:
        """Re-compute the materialized rows that inserted events made stale.

        A tree's rows of a table are stale when an event of a kind the table reads
        (through its views) arrived for that tree, or when a table it reads had that
        tree's rows recomputed. ``tables`` limits the work to what a query needs
        (with what they read); stale rows of other tables wait for their turn.
        A table is re-computed whole after a load, a new watermark or new points.
        """
        self._apply_incoming()
        wanted = [n for n in self.tables if tables is None or n in tables]
        if self._whole.isdisjoint(wanted):
            self._refresh_trees(wanted)
            return
        for name in wanted:  # in dependency order, so what a table reads is fresh
            if name in self._whole:
                sql = self.views[name].sql
                self._execute(self.views[name].path, f"delete from {name}")
                self._execute(self.views[name].path, f"insert into {name} select * from ({sql})")
                self._stale[name].clear()
                self._whole.discard(name)
            else:
                self._refresh_trees([name])

    def _refresh_trees(self, wanted: list[str]) -> None:
        """Re-compute the stale trees' rows of these tables (in dependency order)."""
        if not any(self._stale[n] for n in wanted):
            return
        # Trees that upstream tables make stale are among these, so the scope holds.
        scope = sorted(set().union(*(self._stale[n] for n in wanted)))
        self.con.execute("set variable refresh_trees = ?", [scope])
        # A few trees' rows are small: planning dominates, and these optimizers
        # cost more than they save there (measured: a quarter of the refresh time).
        self.con.execute(f"set disabled_optimizers = '{SMALL_REFRESH_OFF}'")
        try:
            for name in wanted:
                self._refresh_table(name)
        finally:
            self.con.execute("reset disabled_optimizers")
            self.con.execute("reset variable refresh_trees")

    def _refresh_table(self, name: str) -> None:
        trees = self._stale[name]
        if not trees:  # became stale through an upstream table refreshed just now
            return
        view = self.views[name]
        listed = ", ".join("'" + t.replace("'", "''") + "'" for t in sorted(trees))
        self._execute(view.path, f"delete from {name} where tree_id in ({listed})")
        self._execute(
            view.path, f"insert into {name} select * from ({view.sql}) where tree_id in ({listed})"
        )
        for down in self._downstream[name]:
            self._stale[down] |= trees
        self._stale[name] = set()

    def stale(self) -> dict[str, list[str]]:
        """The trees whose rows each materialized table will re-compute before use."""
        self._apply_incoming()
        out = {n: sorted(trees) for n, trees in self._stale.items() if trees}
        return out | {n: ["*"] for n in self._whole}

    def _tables_needed(self, sql: str) -> list[str]:
        """The materialized tables a query reads, directly or through views."""
        if sql not in self._needs:
            raw = self.con.execute("select json_serialize_sql(?)", [sql]).fetchall()[0][0]
            tree = json.loads(raw)
            seen = self._reached(_base_tables(tree) if not tree.get("error") else set(self.views))
            self._needs[sql] = [n for n in self.tables if n in seen]
        return self._needs[sql]

    def _reached(self, names: set[str]) -> set[str]:
        """These views and every view they read, directly or through others."""
        seen: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name in seen or name not in self.views:
                continue
            seen.add(name)
            todo.extend(self._reads[name])
        return seen

    def kinds_read(self, view: str) -> set[str]:
        """The event kinds a view reads, directly or through other views.

        Its rows at a log prefix change only when an event of one of these kinds is
        added (a later tail moves the "now" point of the tree views, not the state
        at it: every view filters events by seq).
        """
        read = set().union(*(self._reads[n] for n in self._reached({view})))
        if "event_log" in read:
            return set(KIND_COLUMNS)
        return {k for k in KIND_COLUMNS if f"log_{k}" in read}

    def _sync_knowledge_patterns(self, where: str) -> None:
        """Copy the recorded knowledge regexes into the variables the views read.

        DuckDB compiles a regex once only when it is a constant; a variable is one.
        ``where`` names the log in the error for a regex DuckDB cannot compile.
        """
        body = self.views["run_config"].sql  # the definition, even before the table is filled
        rows = self.con.execute(f"select path_regex, command_regex from ({body})").fetchall()
        if not rows:
            return
        row = rows[0]
        for name, value in zip(("knowledge_path_regex", "knowledge_command_regex"), row, strict=True):
            if value is not None:
                problem = regex_problem(value, self.con)
                if problem:  # only a forged log: a run's config is checked before it is recorded
                    field = name.replace("_", ".", 1)
                    raise LogError(f"{where}: the run config records {field} = {value!r}, {problem}")
                self.con.execute(f"set variable {name} = ?", [value])

    def set_watermark(self, seq: int | None) -> None:
        """Make every view see only events with ``seq <= seq`` (None: all of them)."""
        if seq is None:
            self.con.execute("reset variable watermark")
        else:
            self.con.execute("set variable watermark = ?", [int(seq)])
        self._whole = set(self.tables)

    def set_points(self, mode: str) -> None:
        """Choose the as-of points of the tree views: 'now' or 'decisions' (replay)."""
        if mode not in ("now", "decisions"):
            raise ValueError(mode)
        self.con.execute("set variable asof_points = ?", [mode])
        self._whole = set(self.tables)

    # -- reading

    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts (the materialized views it reads refreshed first)."""
        self.refresh(self._tables_needed(sql))
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
        self._apply_incoming()
        return self.con.execute("select seq from log_tail").fetchall()[0][0]


def _kind_columns() -> dict[str, list[str]]:
    """The light columns each kind's mirror table holds: envelope plus its own fields."""
    out = {}
    for kind, cls in EVENT_TYPES.items():
        own = set(cls.model_fields) - {"schema_version"}
        out[kind] = [n for n in LIGHT_SCHEMA.names if n in ENVELOPE.names or n in own]
    return out


KIND_COLUMNS = _kind_columns()
