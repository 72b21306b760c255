"""A collection: several runs read together, read-only, through the same views.

Each run's views are read from its stored derived state, through the collection's
:class:`~engine.runset.RunSet` (the door every reader reads through): the
rows of a view, one Parquet file a run with ``run_id`` first, derived once from the
run's log and reused by every later process until the log changes, each file checked
against its digest before it is read (and its size and times before every query: a
damaged one is dropped and derived again). In the main
database a view the query names is one scan of every run's file of it, so a query
over ``trees`` or ``coverage`` sees every run, evaluates no view and pays one
statement, however many runs. A query naming an ``audit_*`` view, or one with a row
per evaluation point or path selection (``asof_seq``, ``selection_seq``), reads the runs' states evaluated at every
recorded decision (what replay reads); any other reads their final state. The
collection is a snapshot: the runs as they were when first queried (``refresh()``
reads them again, a grown run caught up from its last state).

Reads cannot write, by construction (:func:`~engine.catalog.queries.check_query`): a query must be
one SELECT (or a plain EXPLAIN of one - EXPLAIN ANALYZE runs what it explains),
calling no function that changes the session or runs SQL given as text; anything
else is refused before it runs. The instance has external access disabled, with
only the collection's runs' log directories and their own derived states readable, no temporary
directory (nothing spills to disk, so no directory of DuckDB's own is readable or
writable either), and its configuration locked, so a query cannot undo any of it.
DuckDB's allowed directories are writable as well as readable, so the instance is
never handed out (``runs.con`` is an error): an unchecked statement on it could COPY
into a run's log; every query goes through the check.
A query has a memory limit and a time limit
(``Limits``; options of ``sql``, or the environment).

``open_runs(data_dir)`` is the notebook API: ``.sql(query)`` gives a polars DataFrame,
every view is an attribute (``runs.trees``), ``.views`` lists them; variables are set
with ``.set(...)`` only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog.definitions import load_graph, read_macros
from engine.catalog.queries import CheckedQuery, QueryError, RefusedQueryError, check_query, first_line
from engine.results import (
    CANCELLED,
    Cancel,
    Limits,
    QueryCancelledError,
    QueryLimitError,
    Result,
)
from engine.results import parquet_target as parquet_target  # (re-exported: sql's)
from engine.results import write_parquet as write_parquet
from engine.runset import DamagedRun, RunSet
from ingest.text import sql_text

Runs = str | tuple[str, ...] | None  # a query over every run's rows (None), one run's, or several runs'

if TYPE_CHECKING:
    import polars as pl

NO_CONNECTION = (
    "a collection hands out no DuckDB connection (one that reads the runs' logs could write into them): "
    "query with .sql(query), .query(query) or .result(query), read-only"
)


class Collection:
    """Several runs' views, read-only (see the module docstring).

    ``damaged``: the runs under ``data_dir`` left out because ``verify`` finds them
    damaged (only when no runs are named; a named run that is damaged is an error),
    found as the runs are first read.
    """

    def __init__(
        self, data_dir: Path | str, runs: list[str] | RunSet | None = None, limits: Limits | None = None
    ) -> None:
        """``runs``: the names a user typed (a campaign's: its runs; none: every run), or the set they resolve to."""
        self.data_dir = Path(data_dir)
        self.limits = limits or Limits.resolve()
        self.runs = runs if isinstance(runs, RunSet) else RunSet(self.data_dir, runs)
        self.run_ids = self.runs.run_ids  # (the set's: a run left out leaves both)
        self.derived = self.runs.derived
        graph = load_graph(self.derived.views_dir)
        self.views = sorted(graph.views)
        # Views with a row per evaluation point or path selection, and those listing the decisions a
        # point contradicts: a query reading one is answered from states evaluated at every recorded
        # decision (a test checks that every other view has the same rows in either).
        self._at_decisions = {
            n for n, v in graph.views.items() if n.startswith("audit_") or {"asof_seq", "selection_seq"} & set(v.grain)
        }
        self._variables: dict[str, Any] = {}  # set by the caller (reselection weights, ...)
        self._known_variables = set(graph.variable_tables)
        self._bound: dict[str, tuple[str, ...]] = {}  # union view -> the files it reads
        self._binding_lock = threading.RLock()
        self._connect()

    def _connect(self) -> None:
        """The connection queries run on, reading nothing but the collection's runs: their logs and
        their stored states (in every root the derived state may use in this process)."""
        # No temporary directory: DuckDB would make the default one (<cwd>/.tmp) readable and
        # writable to every query despite allowed_directories; nothing spills to disk instead.
        con = duckdb.connect(config={"temp_directory": ""})
        _path, macros, _reads = read_macros()
        con.execute(macros)  # node_key, pct, ...: for queries over the union views too
        con.execute("set allowed_directories = ?", [[f"{d.resolve()}/" for d in self.runs.readable()]])
        con.execute("set enable_external_access = false")
        con.execute(f"set memory_limit = {sql_text(f'{self.limits.memory}B')}")
        con.execute("set global parquet_metadata_cache = true")  # every cursor's: files read again and again
        con.execute("set lock_configuration = true")  # no query can change any of the above
        self._bound = {}
        self._con = con  # never handed out: a query on it is not checked, and COPY could write to the logs

    @property
    def damaged(self) -> list[DamagedRun]:
        """The runs left out as damaged (the runs are read to know, if no query has read them yet)."""
        if not self.runs.read:
            self.runs.states(variables=self._variables)
        return list(self.runs.damaged)

    # -- the runs' states

    def read_ahead(self, queries: list[str]) -> None:
        """Derive now the rows of every view these queries name, for every run: runs with nothing stored are
        derived together with them, stored states lacking some are read together (each view evaluated once
        for them all), not a view at a time as each query comes (each then restoring every run's catalog).
        The queries are checked as when they run."""
        cursor = self._con.cursor()
        try:
            names = set().union(*(check_query(q, cursor).relations for q in queries)) & set(self.views)
        finally:
            cursor.close()
        if names:
            with self._binding_lock:
                self._view_files(names)

    def _view_files(self, names: set[str], only: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
        """The checked files of the rows of each view the query names (:meth:`RunSet.view_files`), evaluated
        at every recorded decision when one of them has a row per evaluation point or path selection."""
        named = sorted(names & set(self.views))
        at_decisions = bool(set(named) & self._at_decisions)
        return self.runs.view_files(named, at_decisions, self._variables, only)

    def set(self, **values: Any) -> None:
        """Set view variables (None: reset) for every run, e.g. reselection weights."""
        unknown = sorted(set(values) - self._known_variables)
        if unknown:
            known = ", ".join(sorted(self._known_variables))
            raise KeyError(f"no view reads the variable {unknown[0]!r} (known: {known})")
        for name, value in values.items():
            if value is None:
                self._variables.pop(name, None)
            else:
                self._variables[name] = value
        self.refresh()

    def refresh(self) -> None:
        """Read the runs again at the next query: a run that grew meanwhile is caught up."""
        self.runs.refresh()

    @property
    def binding_lock(self) -> threading.RLock:
        """Held while the collection's shared state changes (runs read, views bound), never while a query runs."""
        return self._binding_lock

    def _pin(
        self, cursor: duckdb.DuckDBPyConnection, names: set[str], only: tuple[str, ...] | None
    ) -> dict[str, tuple]:
        """Bind the views ``names`` for ``cursor``'s query; the files each view reads.

        Every run's: the collection's union views, bound again when their files change, and
        ``cursor``'s transaction started on them, so its query reads these bindings whatever
        another query binds meanwhile (DuckDB's catalog is read as of a transaction's start).
        Some runs' (``only``): views of the cursor's own (temporary, shadowing the union
        views) over those runs' files, which no other query sees.
        """
        with self.binding_lock:
            files = self._view_files(names, only)
            for name, listed in files.items():
                scan = "select * from read_parquet([" + ", ".join(sql_text(f) for f in listed) + "])"
                if only is not None:
                    cursor.execute(f'create or replace temp view "{name}" as {scan}')
                elif self._bound.get(name) != listed:
                    self._con.execute(f'create or replace view main."{name}" as {scan}')
                    self._bound[name] = listed
            if only is None:
                cursor.begin()
                cursor.execute("select count(*) from duckdb_views()").fetchall()  # the transaction's snapshot
            return files

    def _rebind(
        self, cursor: duckdb.DuckDBPyConnection, names: set[str], only: tuple[str, ...] | None
    ) -> dict[str, tuple]:
        """The runs read again and ``names`` bound anew on ``cursor`` (a stored state replaced while bound)."""
        with self.binding_lock:
            self.refresh()
            return self._pin(cursor, names, only)

    @contextlib.contextmanager
    def _run(self, query: str | CheckedQuery, run_id: Runs = None, cancel: Cancel | None = None) -> Iterator[Result]:
        """One read-only query (checked here unless it was) on a cursor of its own, within the limits;
        RefusedQueryError or QueryError otherwise.

        Queries run at once, each on its cursor (a DuckDB connection serves one thread at
        a time); only binding the views holds a lock. The time limit runs from the query's
        start to the end of this block: the caller's fetching and formatting count.
        """
        cursor = self._con.cursor()
        expired = Cancel()  # fired by a timer at the time limit
        timer = threading.Timer(self.limits.timeout_s, expired)
        timer.daemon = True
        try:
            with expired.watching(cursor), cancel.watching(cursor) if cancel else contextlib.nullcontext():
                checked = check_query(query, cursor)
                names = set(checked.relations)
                only = (run_id,) if isinstance(run_id, str) else None if run_id is None else tuple(run_id)
                files = self._pin(cursor, names, only)
                timer.start()
                yield Result(
                    cursor,
                    checked.text,
                    limits=self.limits,
                    files=files,
                    rebind=lambda: self._rebind(cursor, names, only),
                    in_transaction=only is None,
                    expired=expired,
                    cancel=cancel,
                )
        except duckdb.PermissionException as err:
            raise RefusedQueryError(f"{first_line(err)} (only the runs' logs may be read) - nothing was read") from err
        except duckdb.InterruptException as err:
            if expired.is_set:
                raise QueryLimitError(self.limits.time_message()) from err
            if cancel is not None and cancel.is_set:
                raise QueryCancelledError(CANCELLED) from err
            raise QueryError(first_line(err)) from err
        except duckdb.OutOfMemoryException as err:
            raise QueryLimitError(self.limits.memory_message(err)) from err
        except duckdb.Error as err:
            raise QueryError(first_line(err)) from err
        finally:
            # Joined, not only cancelled: a timer thread still ending at the interpreter's exit
            # would drop the last reference to this connection there, and DuckDB aborts the
            # process when its instance is destroyed during finalization (exit 134).
            timer.cancel()
            if timer.is_alive():
                timer.join()
            cursor.close()

    def result(self, query: str | CheckedQuery, run_id: Runs = None, cancel: Cancel | None = None):
        """A context manager: the :class:`Result` of a read-only query, its rows fetched in batches within its
        limits (its time limit ends with the block); ``cancel``: stops it from another thread."""
        return self._run(query, run_id, cancel)

    def query(self, query: str, run_id: Runs = None) -> list[dict[str, Any]]:
        """Rows of a read-only query, as dicts; ``run_id``: over that run's rows alone (reads only its files), or
        a tuple of runs: over theirs."""
        with self._run(query, run_id) as result:
            columns = result.columns
            return [dict(zip(columns, row, strict=True)) for batch in result.batches() for row in batch]

    def arrow(self, query: str):
        """The result of a read-only query as an Arrow table."""
        import pyarrow as pa

        with self._run(query) as result:
            reader = result.record_batches()
            return pa.Table.from_batches(list(reader), reader.schema)

    def sql(self, query: str) -> pl.DataFrame:
        """The result of a read-only query as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self.arrow(query))

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name == "con":
            raise AttributeError(NO_CONNECTION)
        if name.startswith("_") or name not in self.__dict__.get("views", ()):
            raise AttributeError(name)
        return self.sql(f"select * from {name}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.views))


def open_runs(data_dir: Path | str, run_ids: list[str] | None = None, limits: Limits | None = None) -> Collection:
    """Read these runs (default: every run under ``data_dir`` that is not damaged) through the views, read-only."""
    return Collection(data_dir, run_ids, limits)
