"""A collection: several runs read together, read-only, through the same views.

Each run's catalog lives in an in-memory database of its own (``run_1``, ``run_2``,
...) of one DuckDB instance, evaluated at every recorded decision (so the ``audit_*``
views mean what replay reads). In the main database every view of the catalog is the
union of the runs' rows, ``run_id`` first (created when a query first names it): a
query over ``trees`` or ``coverage`` sees every run, and no run's events are copied
anywhere. Queries are read-only by DuckDB's
own means: a statement must parse (DuckDB's parser) as a query, and once the logs are
loaded the instance has external access disabled, with only the runs' log
directories readable.

``open_runs(data_dir)`` is the notebook API: ``.sql(query)`` gives a polars DataFrame,
every view is an attribute (``runs.trees``), ``.views`` lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from engine.catalog import Catalog, QueryError
from engine.catalog.definitions import read_macros, relations_read
from engine.replay import loaded_at_decisions
from ingest.errors import InputError, LogError
from ingest.events import as_utf8
from ingest.log import EventLog, run_ids

READ_ONLY = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
# Variables each run's config gives its views (its defaults, see variables.py): one value
# serves every run's views queried from the main database, so the runs must agree on it.
RUN_DEFAULTS = ("knowledge_path_regex", "knowledge_command_regex")


class RefusedQueryError(InputError):
    """A query that is not read-only, or reads outside the runs' logs; nothing was run."""


class Collection:
    """Several runs' views, read-only (see the module docstring)."""

    def __init__(self, data_dir: Path | str, runs: list[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.run_ids = list(dict.fromkeys(runs)) if runs else run_ids(self.data_dir)
        if not self.run_ids:
            raise LogError(f"no runs under {self.data_dir / 'runs'}")
        self.con = duckdb.connect()
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
        self.con.execute("set allowed_directories = ?", [[f"{log.log_dir.resolve()}/" for log in logs]])
        self.con.execute("set enable_external_access = false")

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
        """``fetch`` the result of one read-only query; RefusedQueryError or QueryError otherwise."""
        if as_utf8(query) != query:  # DuckDB's binding raises TypeError on a lone surrogate
            raise QueryError(f"the query is not UTF-8 text: {as_utf8(query)!r} (U+FFFD for its other bytes)")
        try:
            statements = self.con.extract_statements(query)
        except duckdb.Error as err:
            raise QueryError(_first_line(err)) from err
        if len(statements) != 1:
            raise RefusedQueryError(f"give one query at a time ({len(statements)} statements given) - nothing was run")
        kind = statements[0].type
        if kind not in READ_ONLY:
            msg = (f"only a read-only query (a SELECT) is allowed, not a statement of type {kind.name} - "
                   "nothing was run")  # fmt: skip
            raise RefusedQueryError(msg)
        try:
            self._union(relations_read(self.con, query) or set())
            return fetch(query)
        except duckdb.PermissionException as err:
            raise RefusedQueryError(f"{_first_line(err)} (only the runs' logs may be read) - nothing was read") from err
        except duckdb.Error as err:
            raise QueryError(_first_line(err)) from err

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


def open_runs(data_dir: Path | str, run_ids: list[str] | None = None) -> Collection:
    """Read these runs (default: every run under ``data_dir``) through the views, read-only."""
    return Collection(data_dir, run_ids)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0]


def write_parquet(table, path: Path) -> int:
    """Write a query result to ``path`` atomically (a temporary file renamed); its row count.

    OutputError names the file when the machine refuses the write; nothing is left.
    """
    import os

    import pyarrow.parquet as pq

    from ingest.errors import OutputError

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write the result ({err.strerror or err})") from err
    return table.num_rows
