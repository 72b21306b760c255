"""View definitions: the ``views/*.sql`` files, their headers and their dependency order.

Each file holds one bare ``select`` whose name is the file's stem, after a header::

    -- One row per node: depth, score, Q and leaf reason (ALGORITHM §2).
    -- grain: run_id, tree_id, node_id
    -- sources: int_nodes__asof, run_config
    -- materialized: table
    -- variables: knowledge_path_regex = path_regex
    --
    -- Optional notes.

The summary is every line before the first ``key: value`` line. ``sources`` lists the
relations the SQL reads (a test checks it against the SQL itself); ``materialized:
table`` keeps the view as a table (see refresh.py); ``variables`` names session
variables whose default is a column of this one-row view (see variables.py).
``_macros.sql`` defines the SQL macros every view may call.
"""

from __future__ import annotations

import functools
import graphlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from engine.catalog.queries import parse
from ingest.errors import ViewBuildError
from ingest.paths import file_signature

VIEWS_DIR = Path(__file__).resolve().parent.parent.parent / "views"
MACROS_FILE = "_macros.sql"
_HEADER_KEYS = ("grain", "sources", "materialized", "variables")
_VARIABLE_RE = re.compile(r"getvariable\('([a-z_]+)'\)")
_MACRO_RE = re.compile(r"create or replace macro ([a-z_]+)\s*\(", re.IGNORECASE)


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
    defaults: dict[str, str] = field(default_factory=dict)  # variable -> column of this view

    @property
    def tree_scoped(self) -> bool:
        """Whether rows belong to one tree of one run each (refreshable tree by tree)."""
        return self.grain[:2] == ("run_id", "tree_id")


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_view(path: Path, text: str) -> ViewDef:
    """The definition held by one view file; ViewBuildError names a malformed header."""
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line[2:].strip())
    summary: list[str] = []
    fields: dict[str, str] = {}
    notes = []
    for line in header:
        m = re.match(rf"^({'|'.join(_HEADER_KEYS)}):\s*(.*)$", line)
        if m:
            fields[m[1]] = m[2]
        elif not fields:
            summary.append(line)
        elif line:
            notes.append(line)
    if not summary or not summary[0] or "grain" not in fields or "sources" not in fields:
        msg = (
            f"{path}: the header must start with '-- <what it derives>' and have "
            "'-- grain: <columns>' and '-- sources: <relations>' lines"
        )
        raise ViewBuildError(msg)
    if fields.get("materialized", "table") != "table":
        raise ViewBuildError(f"{path}: 'materialized' can only be 'table'")
    defaults = {}
    for item in _split(fields.get("variables", "")):
        var, sep, column = (x.strip() for x in item.partition("="))
        if not sep or not var or not column:
            raise ViewBuildError(f"{path}: 'variables' lists 'name = column' pairs, got {item!r}")
        defaults[var] = column
    return ViewDef(
        path.stem,
        path,
        " ".join(summary),
        _split(fields["grain"]),
        _split(fields["sources"]),
        "\n".join(notes),
        text,
        "materialized" in fields,
        defaults,
    )


def read_views(views_dir: Path = VIEWS_DIR) -> dict[str, ViewDef]:
    """Parse every view file of ``views_dir`` (files starting with '_' are not views)."""
    return {
        path.stem: parse_view(path, path.read_text())
        for path in sorted(views_dir.glob("*.sql"))
        if not path.name.startswith("_")
    }


def read_macros(views_dir: Path = VIEWS_DIR) -> tuple[Path, str, dict[str, set[str]]]:
    """The macros file, its SQL, and the session variables each macro reads."""
    path = views_dir / MACROS_FILE
    sql = path.read_text() if path.exists() else ""
    reads: dict[str, set[str]] = {}
    for statement in sql.split(";"):
        m = _MACRO_RE.search(statement)
        if m:
            reads[m[1]] = set(_VARIABLE_RE.findall(statement))
    return path, sql, reads


def variables_read(sql: str, macros: dict[str, set[str]]) -> set[str]:
    """The session variables a SQL text reads, directly or through the macros it calls."""
    found = set(_VARIABLE_RE.findall(sql))
    for name, reads in macros.items():
        if re.search(rf"\b{name}\s*\(", sql):
            found |= reads
    return found


def referenced_relations(con: duckdb.DuckDBPyConnection, sql: str, where: Path | str) -> set[str]:
    """The relations (views, tables) a view's SQL reads, minus its own CTE names; ViewBuildError names an
    unparseable one."""
    parsed = parse(con, sql)
    if isinstance(parsed, str):
        raise ViewBuildError(f"{where}: {parsed}")
    return set(parsed.relations)


def load_graph(views_dir: Path = VIEWS_DIR) -> ViewGraph:
    """The views and macros of ``views_dir`` and their graph, analysed once per process for the same files.

    A collection makes a catalog per run; parsing and analysing the files again for
    each one cost ~60 ms a run.
    """
    files = sorted(Path(views_dir).glob("*.sql"))
    signature = tuple((f.name, *file_signature(f)) for f in files)
    return _graph(Path(views_dir).resolve(), signature)


@functools.lru_cache(maxsize=8)
def _graph(views_dir: Path, signature: tuple) -> ViewGraph:
    return ViewGraph(read_views(views_dir), read_macros(views_dir))


class ViewGraph:
    """The views, what each reads, and their dependency order (and the macros they may call).

    What a view reads is its declared ``sources`` (tests/test_views.py checks that
    they are exactly what its SQL reads; parsing every view costs 0.2 s).
    """

    def __init__(self, views: dict[str, ViewDef], macros: tuple[Path, str, dict[str, set[str]]] | None = None) -> None:
        self.views = views
        self.macros_path, self.macros_sql, self.macros = macros or (Path(MACROS_FILE), "", {})
        self.reads = {n: set(v.sources) for n, v in views.items()}
        self.order = self._dependency_order()
        self.tables = [n for n in self.order if views[n].materialized]

    @functools.cached_property
    def variable_tables(self) -> dict[str, set[str]]:
        """Every session variable a view reads, with the materialized tables that read it (directly or not)."""
        direct = {n: variables_read(v.sql, self.macros) for n, v in self.views.items()}
        used = set().union(*direct.values()) if direct else set()
        affects = {}
        for var in sorted(used):
            readers = self.readers({n for n, vs in direct.items() if var in vs})
            affects[var] = {t for t in self.tables if t in readers}
        return affects

    def _dependency_order(self) -> list[str]:
        graph = {}
        for name, view in self.views.items():
            deps = self.reads[name] & set(self.views)
            if name in deps:
                raise ViewBuildError(f"{view.path}: the view reads itself")
            graph[name] = deps
        try:
            return list(graphlib.TopologicalSorter(graph).static_order())
        except graphlib.CycleError as err:
            cycle = " -> ".join(err.args[1])
            raise ViewBuildError(f"views/ has a dependency cycle: {cycle}") from err

    def reached(self, names: set[str]) -> set[str]:
        """These views and every view they read, directly or through others."""
        seen: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name in seen or name not in self.views:
                continue
            seen.add(name)
            todo.extend(self.reads[name])
        return seen

    def relations_read(self, name: str) -> set[str]:
        """Every relation (view or base table) a view reads, directly or through views."""
        return set().union(*(self.reads[n] for n in self.reached({name})))

    def readers(self, names: set[str]) -> set[str]:
        """The views that read any of ``names``, directly or through other views."""
        return {n for n in self.views if self.relations_read(n) & names or n in names}
