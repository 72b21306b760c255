"""A collection: several runs read together, read-only, through the same views.

Each run's catalog lives in an in-memory database of its own (``run_1``, ``run_2``,
...) of one DuckDB instance, evaluated at every recorded decision (so the ``audit_*``
views mean what replay reads). In the main database every view of the catalog is the
union of the runs' rows, ``run_id`` first (created when a query first names it): a
query over ``trees`` or ``coverage`` sees every run, and no run's events are copied
anywhere.

Reads cannot write, by construction (:func:`read_only`): a query must be
one SELECT (or a plain EXPLAIN of one - EXPLAIN ANALYZE runs what it explains),
calling no function that changes the session or runs SQL given as text; anything
else is refused before it runs. Once the logs are loaded the instance has external
access disabled, with only the runs' log directories readable, no temporary
directory (nothing spills to disk, so no directory of DuckDB's own is readable or
writable either), and its configuration locked, so a query cannot undo any of it.
A query has a memory limit (beyond what the loaded runs hold) and a time limit
(``Limits``; options of ``sql``, or the environment).

``open_runs(data_dir)`` is the notebook API: ``.sql(query)`` gives a polars DataFrame,
every view is an attribute (``runs.trees``), ``.views`` lists them; variables are set
with ``.set(...)`` only.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from engine.catalog import Catalog, QueryError
from engine.catalog.definitions import read_macros, relations_read
from engine.replay import loaded_at_decisions
from engine.runs import DamagedRun, runs_to_read
from ingest.errors import InputError, OutputError
from ingest.events import as_utf8
from ingest.log import EventLog
from ingest.paths import outside_data

SELECT = duckdb.StatementType.SELECT
# Functions a SELECT may call that change the session (a seed, a sequence, DuckDB's own
# log) or run SQL given as a string (which the check below cannot see into). The ones
# that change configuration (profiling, logging, grammar extensions) are refused by
# the locked configuration as well.
REFUSED_FUNCTIONS = frozenset({
    "query", "query_table", "json_execute_serialized_sql", "setseed", "nextval", "setval", "write_log",
    "checkpoint", "force_checkpoint", "truncate_duckdb_logs", "enable_profiling", "disable_profiling",
    "enable_logging", "disable_logging", "add_grammar_extension", "remove_grammar_extension",
    "create_external_resource", "register_external_resource", "register_external_resource_type",
    "deregister_external_resource", "destroy_external_resource",
})  # fmt: skip
MEMORY_ENV = "TEACHER_MCTS_SQL_MEMORY"
TIMEOUT_ENV = "TEACHER_MCTS_SQL_TIMEOUT_S"
DEFAULT_MEMORY = "4GB"  # a 2-core, 24 GiB machine: several such queries, or one and a run, fit beside each other
DEFAULT_TIMEOUT_S = 300.0
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
# Variables each run's config gives its views (its defaults, see variables.py): one value
# serves every run's views queried from the main database, so the runs must agree on it.
RUN_DEFAULTS = ("knowledge_path_regex", "knowledge_command_regex")


class RefusedQueryError(InputError):
    """A query that is not read-only, or reads outside the runs' logs; nothing was run."""


class QueryLimitError(QueryError):
    """A query went past its time or memory limit and was stopped; nothing was written."""


@dataclass(frozen=True)
class Limits:
    """What one query may take: memory beyond the loaded runs' (bytes), and seconds."""

    memory: int
    timeout_s: float
    memory_text: str  # as given, for messages

    @classmethod
    def resolve(cls, memory: str | None = None, timeout_s: float | str | None = None) -> Limits:
        """The limits given, else ``$TEACHER_MCTS_SQL_MEMORY`` / ``$TEACHER_MCTS_SQL_TIMEOUT_S``, else the defaults.

        InputError names a value that is not a size (``4GB``, ``512MiB``) or a positive number of seconds.
        """
        memory = memory or os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", memory.lower())
        if not m or float(m[1]) <= 0:
            msg = f"memory limit {memory!r} is not a size such as 4GB or 512MiB (--memory-limit, ${MEMORY_ENV})"
            raise InputError(msg)
        if timeout_s is None:
            timeout_s = os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S
        try:
            seconds = float(timeout_s)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            msg = f"time limit {timeout_s!r} is not a positive number of seconds (--timeout, ${TIMEOUT_ENV})"
            raise InputError(msg)
        return cls(int(float(m[1]) * UNITS[m[2] or "b"]), seconds, memory.strip())


class Collection:
    """Several runs' views, read-only (see the module docstring).

    ``damaged``: the runs under ``data_dir`` left out because ``verify`` finds them
    damaged (only when no runs are named; a named run that is damaged is an error).
    """

    def __init__(self, data_dir: Path | str, runs: list[str] | None = None, limits: Limits | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.limits = limits or Limits.resolve()
        self.damaged: list[DamagedRun]
        self.run_ids, self.damaged = runs_to_read(self.data_dir, runs)
        # No temporary directory: DuckDB would make the default one (<cwd>/.tmp) readable and
        # writable to every query despite allowed_directories; nothing spills to disk instead.
        self.con = duckdb.connect(config={"temp_directory": ""})
        self.catalogs: dict[str, Catalog] = {}
        logs = []
        for i, run_id in enumerate(self.run_ids, start=1):
            log = EventLog(self.data_dir, run_id).require()
            self.catalogs[run_id] = loaded_at_decisions(Catalog.inside(self.con, f"run_{i}"), log)
            logs.append(log)
        self.views = sorted(next(iter(self.catalogs.values())).views)
        _path, macros, _reads = read_macros()
        self.con.execute(macros)  # node_key, pct, ...: for queries over the union views too
        self._unions: set[str] = set()
        self._main_variables({"asof_points": "decisions"} | self._run_defaults())
        self.refresh()
        for catalog in self.catalogs.values():
            catalog.plan.tune_optimizers = False  # a locked configuration refuses the refresh's tuning
        self.con.execute("set allowed_directories = ?", [[f"{log.log_dir.resolve()}/" for log in logs]])
        self.con.execute("set enable_external_access = false")
        # What a query may take comes on top of what the loaded runs hold already.
        held = self.con.execute("select coalesce(sum(memory_usage_bytes), 0) from duckdb_memory()").fetchone()[0]
        self.con.execute(f"set memory_limit = '{held + self.limits.memory}B'")
        self.con.execute("set lock_configuration = true")  # no query can change any of the above

    def _union(self, names: set[str]) -> None:
        """Create the union views of these views (on first use: binding one costs ~10 ms a run)."""
        for name in sorted(names & set(self.views) - self._unions):
            columns = [d[0] for d in self.con.execute(f"select * from run_1.main.{name} limit 0").description]
            run = "" if "run_id" in columns else "'{run_id}' as run_id, "  # events carry their run already
            members = " union all by name ".join(
                f"select {run.format(run_id=run_id)}* from run_{i}.main.{name}"
                for i, run_id in enumerate(self.run_ids, start=1)
            )
            self.con.execute(f"create view main.{name} as {members}")
            self._unions.add(name)

    def _run_defaults(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in RUN_DEFAULTS:
            found = {c.variables.values.get(name) for c in self.catalogs.values()}
            if len(found) > 1:
                msg = (f"the runs {', '.join(self.run_ids)} record different {name.replace('_', '.', 1)} "
                       "patterns - read them in separate collections")  # fmt: skip
                raise InputError(msg)
            values[name] = found.pop()
        return values

    def _main_variables(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if value is None:
                self.con.execute(f"reset variable {name}")
            else:
                self.con.execute(f"set variable {name} = ?", [value])

    def set(self, **values: Any) -> None:
        """Set view variables (None: reset) for every run, e.g. reselection weights."""
        for catalog in self.catalogs.values():
            catalog.variables.set(**values)
        self._main_variables(values)
        self.refresh()

    def refresh(self) -> None:
        """Bring every run's materialized views up to date (they are read from the main database)."""
        for catalog in self.catalogs.values():
            catalog.refresh()

    def _run(self, query: str, fetch):
        """``fetch`` the result of one read-only query within the limits; RefusedQueryError or QueryError otherwise."""
        select = read_only(query, self.con)
        # A timer stops the query at its time limit (DuckDB's interrupt; one that comes
        # after the query ended changes nothing).
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            self.con.interrupt()

        timer = threading.Timer(self.limits.timeout_s, stop)
        timer.daemon = True
        try:
            self._union(relations_read(self.con, select) or set())
            timer.start()
            return fetch(query)
        except duckdb.PermissionException as err:
            raise RefusedQueryError(f"{_first_line(err)} (only the runs' logs may be read) - nothing was read") from err
        except duckdb.InterruptException as err:
            if fired.is_set():
                msg = (f"the query ran past its time limit of {self.limits.timeout_s:g} s and was stopped - "
                       f"nothing was written (give more with --timeout or ${TIMEOUT_ENV})")  # fmt: skip
                raise QueryLimitError(msg) from err
            raise QueryError(_first_line(err)) from err
        except duckdb.OutOfMemoryException as err:
            msg = (f"the query needed more memory than its limit of {self.limits.memory_text} and was stopped - "
                   f"nothing was written (give more with --memory-limit or ${MEMORY_ENV}): "
                   f"{_first_line(err)}")  # fmt: skip
            raise QueryLimitError(msg) from err
        except duckdb.Error as err:
            raise QueryError(_first_line(err)) from err
        finally:
            timer.cancel()

    def query(self, query: str) -> list[dict[str, Any]]:
        """Rows of a read-only query, as dicts."""

        def rows(sql: str) -> list[dict[str, Any]]:
            cur = self.con.execute(sql)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

        return self._run(query, rows)

    def arrow(self, query: str):
        """The result of a read-only query as an Arrow table."""
        return self._run(query, lambda sql: self.con.sql(sql).to_arrow_table())

    def sql(self, query: str) -> pl.DataFrame:
        """The result of a read-only query as a polars DataFrame."""
        return pl.from_arrow(self.arrow(query))

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name.startswith("_") or name not in self.__dict__.get("views", ()):
            raise AttributeError(name)
        return self.sql(f"select * from {name}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.views))


def read_only(query: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """The SELECT ``query`` runs (itself, or the one it EXPLAINs); RefusedQueryError (nothing run) otherwise.

    The statement's type is not enough: EXPLAIN ANALYZE has type EXPLAIN and runs the
    statement it explains, so an EXPLAIN must explain a SELECT, and a SELECT must call
    no function of REFUSED_FUNCTIONS. ``con``: any connection (it only parses; default
    a new one), so that ``sql`` refuses a statement before it reads any run.
    """
    con = con or duckdb.connect(config={"temp_directory": ""})
    if as_utf8(query) != query:  # DuckDB's binding raises TypeError on a lone surrogate
        raise QueryError(f"the query is not UTF-8 text: {as_utf8(query)!r} (U+FFFD for its other bytes)")
    statements = _statements(con, query)
    if len(statements) != 1:
        raise RefusedQueryError(f"give one query at a time ({len(statements)} statements given) - nothing was run")
    kind, body = statements[0].type, query
    if kind == duckdb.StatementType.EXPLAIN:
        body = _explained(query)
        try:
            inner = _statements(con, body)
        except QueryError:  # "ANALYZE <statement>", "(FORMAT json) <statement>": no statement alone
            inner = []
        if len(inner) != 1 or inner[0].type != SELECT:
            msg = ("only EXPLAIN of a SELECT is allowed (not EXPLAIN ANALYZE, which runs the statement it "
                   "explains, nor EXPLAIN of anything else) - nothing was run")  # fmt: skip
            raise RefusedQueryError(msg)
    elif kind != SELECT:
        msg = f"only a read-only query (a SELECT) is allowed, not a statement of type {kind.name} - nothing was run"
        raise RefusedQueryError(msg)
    tree = json.loads(con.execute("select json_serialize_sql(?)", [body]).fetchone()[0])
    if tree.get("error"):
        raise RefusedQueryError(f"the query cannot be checked ({tree.get('error_message')}) - nothing was run")
    refused = sorted(_functions(tree) & REFUSED_FUNCTIONS)
    if refused:
        msg = (f"{refused[0]}() is not allowed in a query: it changes the session or runs SQL given as text - "
               "nothing was run")  # fmt: skip
        raise RefusedQueryError(msg)
    return body


def _statements(con: duckdb.DuckDBPyConnection, query: str) -> list:
    try:
        return con.extract_statements(query)
    except duckdb.Error as err:
        raise QueryError(_first_line(err)) from err


def open_runs(data_dir: Path | str, run_ids: list[str] | None = None, limits: Limits | None = None) -> Collection:
    """Read these runs (default: every run under ``data_dir`` that is not damaged) through the views, read-only."""
    return Collection(data_dir, run_ids, limits)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0]


def _explained(query: str) -> str:
    """The text after an EXPLAIN statement's first keyword (``EXPLAIN``), comments before it skipped."""
    raw = query.encode()  # the tokenizer's positions are byte offsets
    tokens = [pos for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]
    if len(tokens) < 2 or not raw[tokens[0]:].lower().startswith(b"explain"):
        return ""
    return raw[tokens[1]:].decode()


def _functions(tree: Any) -> set[str]:
    """The names of every function a serialized statement calls (scalar, aggregate, table), lower case."""
    found: set[str] = set()
    if isinstance(tree, dict):
        if tree.get("class") == "FUNCTION" and isinstance(tree.get("function_name"), str):
            found.add(tree["function_name"].lower())
        for value in tree.values():
            found |= _functions(value)
    elif isinstance(tree, list):
        for value in tree:
            found |= _functions(value)
    return found


def parquet_target(path: Path, data_dir: Path, overwrite: bool = False) -> Path:
    """``path`` if a query's result may be written there; OutputError (nothing run or written) otherwise.

    Never among the runs of the data directory (a run's log, its spool, its quarantine:
    the file would replace recorded events), and never onto an existing file unless
    ``overwrite``.
    """
    path = outside_data(path, data_dir, "the result")
    if path.exists() and not overwrite:
        raise OutputError(f"{path}: exists already - give --overwrite to replace it; nothing was run")
    return path


def write_parquet(table, path: Path, data_dir: Path, overwrite: bool = False) -> int:
    """Write a query result to ``path`` atomically (a temporary file renamed); its row count.

    OutputError when :func:`parquet_target` refuses the path, or names the file when
    the machine refuses the write; nothing is left.
    """
    import pyarrow.parquet as pq

    path = parquet_target(path, data_dir, overwrite)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write the result ({err.strerror or err})") from err
    return table.num_rows
