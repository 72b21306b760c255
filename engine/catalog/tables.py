"""The log's events inside DuckDB: one table per event kind, loaded from parts or appended.

``log_<kind>`` holds the light columns of one kind (the envelope and that kind's own
fields), so a staging view scans only its own kind; the view ``event_log`` is their
union and ``log_tail`` the largest seq held. Only the ``stg_*`` views (and ``events``, over
``event_log``) read them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

from ingest.checks import check_part
from ingest.columns import ENVELOPE, KIND_FIELDS, LIGHT_SCHEMA
from ingest.encoding import GROUP_SHARE
from ingest.errors import LogError
from ingest.listing import Moved, while_moving
from ingest.reader import EventLog
from ingest.text import sql_text


def _kind_columns() -> dict[str, list[str]]:
    """The light columns each kind's table holds: envelope plus its own fields."""
    return {
        kind: [n for n in LIGHT_SCHEMA.names if n in ENVELOPE.names or n in own] for kind, own in KIND_FIELDS.items()
    }


KIND_COLUMNS = _kind_columns()
LOG_RELATIONS = frozenset({f"log_{k}" for k in KIND_COLUMNS} | {"log_tail", "event_log"})

# What arrived in one batch of events: kind -> the trees it concerns (None: no tree).
Arrivals = dict[str, set[str | None]]
# A kind with at least this many rows in a load is copied by a scan of the files of its own, not through
# the temporary table of the small kinds, every column of which its rows would fill (measured: a load of
# ~1M events 1.0 -> 0.6 s, its 5 kinds of 17k-71k rows scanned apart; at ~30k events no kind has as many).
OWN_SCAN_ROWS = 10_000


class LogTables:
    """The per-kind event tables of one connection, and how events get into them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, created: bool = False) -> None:
        """The tables of ``con``'s current database (``created``: they exist already, empty)."""
        self.con = con
        # On a sandboxed connection (engine.catalog.sandbox) DuckDB reads no Python variable: Arrow tables are
        # registered there; elsewhere read by name from the frame (its replacement scan: twice as fast).
        self._registers = not con.execute("select current_setting('enable_external_access')").fetchall()[0][0]
        if not created:
            for kind, names in KIND_COLUMNS.items():
                # (not Schema.empty_table(), which imports pandas: 0.2 s of a cold read)
                empty = pa.Table.from_batches([], pa.schema([LIGHT_SCHEMA.field(n) for n in names]))
                if self._registers:
                    con.register("empty", empty)
                con.execute(f"create table log_{kind} as select * from empty")
                if self._registers:
                    con.unregister("empty")
            union = "\nunion all by name\n".join(f"select * from log_{k}" for k in KIND_COLUMNS)
            con.execute(f"create view event_log as\n{union}")
            # The largest seq held of each run, kept up to date as events arrive (so "now" costs no scan).
            con.execute("create table log_tail (run_id varchar primary key, seq bigint)")
        self._incoming: list[pa.Table] = []

    def insert(self, table: pa.Table) -> None:
        """Buffer appended events (any superset of the light columns) until :meth:`apply`.

        Many small appends then cost one insert per kind.
        """
        if table.num_rows:
            self._incoming.append(table)

    def apply(self) -> Arrivals:
        """Write the buffered events into their kinds' tables; return what arrived."""
        if not self._incoming:
            return {}
        incoming = pa.concat_tables(self._incoming, promote_options="default")
        self._incoming = []
        present = set(incoming.column_names)
        keys = ["kind", "tree_id"] if "tree_id" in present else ["kind"]
        groups = incoming.group_by(keys, use_threads=False).aggregate([]).to_pylist()
        arrivals: Arrivals = {}
        for g in groups:
            arrivals.setdefault(g["kind"], set()).add(g.get("tree_id"))
        self._insert_kinds(incoming, set(arrivals), present)
        tails = incoming.group_by("run_id", use_threads=False).aggregate([("seq", "max")]).to_pylist()
        self._grow_tail({t["run_id"]: t["seq_max"] for t in tails})
        return arrivals

    def _grow_tail(self, tails: dict[str, int], grow: bool = True) -> None:
        """Set each run's largest seq held (``grow``: to the larger of the held and the given)."""
        # (an update, then an insert when the run has no row yet: an upsert costs ~2.5x an update)
        update = "greatest(seq, $seq)" if grow else "$seq"
        for run_id, seq in tails.items():
            sql = f"update log_tail set seq = {update} where run_id = $run"
            found = self.con.execute(sql, {"seq": seq, "run": run_id})
            if not found.fetchall()[0][0]:
                self.con.execute("insert into log_tail values (?, ?)", [run_id, seq])

    def load(self, logs: list[tuple[EventLog, int, int | None]], scoped: Callable) -> Arrivals:
        """Insert the published events of each ``(log, after, upto)``: those after seq ``after`` (up to
        ``upto``: all when None), read by DuckDB from the logs' parts in one scan, whatever their number.

        Each kind's table reads only its columns (no Arrow copy of the whole log in
        between). Every part is first checked against the checksum its name records
        and its footer (``check_part``: every byte read once), so a damaged page of a
        column no view reads is still found. The parts are read in one transaction:
        when compaction replaced a part meanwhile, the load is rolled back and taken
        again from a new listing. ``scoped`` sets session variables for a block (the
        catalog's). Returns what arrived. Buffered events must have been applied first.
        """
        checked: dict[Path, set[str]] = {}  # parts checked by an earlier attempt
        # each run's events (its parts may hold events beyond upto: a part merged since the run's tail was read)
        bounds = " or ".join(
            f"(run_id = {sql_text(log.run_id)} and seq > {int(after)}"
            + ("" if upto is None else f" and seq <= {int(upto)}")
            + ")"
            for log, after, upto in logs
        )

        def loaded() -> Arrivals:
            parts = [
                p
                for log, after, upto in logs
                for p in log.parts()
                if p.last > after and (upto is None or p.first <= upto)
            ]
            files = [str(p.path) for p in parts]
            if not files:
                return {}
            try:
                for p in parts:
                    if p.path not in checked:
                        checked[p.path] = set(check_part(p).names)
                present = set().union(*(checked[p.path] for p in parts))
                with scoped(load_files=files):
                    return self._load_files(present, bounds)
            except (OSError, duckdb.Error) as err:
                if all(Path(f).exists() for f in files):
                    where = self._unreadable(files) or ", ".join(str(log.log_dir) for log, *_ in logs)
                    raise LogError(f"{where}: cannot read the log: {err}") from err
                raise Moved(f"a part was compacted away while read ({err})") from err

        dirs = ", ".join(str(log.log_dir) for log, *_ in logs)
        return while_moving(dirs, loaded, "parts kept disappearing while reading - try again")

    def _load_files(self, present: set[str], bounds: str) -> Arrivals:
        source = f"(select * from read_parquet(getvariable('load_files'), union_by_name = true) where {bounds})"
        # Rows of a log table have no order (every view orders by seq where order
        # matters), so the parts may be copied in parallel (measured: load -20%).
        self.con.execute("set preserve_insertion_order = false")
        try:
            self.con.execute("begin transaction")
            tree = "tree_id" if "tree_id" in present else "null"
            arrivals: Arrivals = {}
            rows: dict[str, int] = {}
            tails: dict[str, int] = {}
            counted = f"select run_id, kind, {tree}, count(*), max(seq) from {source} group by all"
            for run_id, kind, tree_id, n, last in self.con.execute(counted).fetchall():
                arrivals.setdefault(kind, set()).add(tree_id)
                rows[kind] = rows.get(kind, 0) + n
                tails[run_id] = max(tails.get(run_id, 0), last)
            self._copy_kinds(source, rows, present)
            self._grow_tail(tails)
            self.con.execute("commit")
            return arrivals
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("rollback")
            raise
        finally:
            self.con.execute("reset preserve_insertion_order")

    def _copy_kinds(self, source: str, rows: dict[str, int], present: set[str]) -> None:
        """Copy the events of ``source`` (``rows``: how many of each kind) into their kinds' tables.

        A kind holding >= 1/GROUP_SHARE of the rows has row groups of its own in a merged
        part: its scan of the files skips the others. So does a kind of OWN_SCAN_ROWS rows
        or more: its scan reads its own columns only. The other kinds are read from the
        files once, into a temporary table of their columns, and split from there (a scan
        of the files per kind costs ~8 ms however few its rows: 17 small kinds took ~60%
        of a load).
        """
        total = sum(rows.values())
        large = {k for k, n in rows.items() if n * GROUP_SHARE >= total or n >= OWN_SCAN_ROWS}
        self._insert_kinds(source, large, present)
        small = (set(rows) - large) & set(KIND_COLUMNS)
        if not small:
            return
        columns = set().union(*(KIND_COLUMNS[k] for k in small)) & present
        light = ", ".join(f'"{c}"' for c in LIGHT_SCHEMA.names if c in columns)
        kinds = ", ".join(sql_text(k) for k in sorted(small))
        self.con.execute(
            f"create or replace temp table log_incoming as select {light} from {source} where kind in ({kinds})"
        )
        self._insert_kinds("log_incoming", small, present)
        self.con.execute("drop table log_incoming")

    def _unreadable(self, files: list[str]) -> str:
        """The first part DuckDB cannot scan (else ""), for an error message.

        Hashing every column decodes every page (statistics cannot answer it), and the
        one-row answer makes any failure a ``duckdb.Error`` of ``execute`` (a streamed
        Arrow reader raised some as OSError, depending on when the scan failed).
        """
        for f in files:
            try:
                self.con.execute("select bit_xor(hash(columns(*))) from read_parquet(?)", [f])
            except duckdb.Error:
                return f
        return ""

    def _insert_kinds(self, source: str | pa.Table, kinds: set[str], present: set[str]) -> None:
        """Copy the events of ``source`` (SQL relation or Arrow table) into their kinds' tables.

        Only the columns ``present`` in the source are read (absent ones are null);
        kinds this version does not know are left out. An Arrow table is read by name
        from this frame, or registered (see __init__).
        """
        incoming = source if isinstance(source, pa.Table) else None
        relation = "incoming" if isinstance(source, pa.Table) else source
        if incoming is not None and self._registers:
            self.con.register("incoming", incoming)
        try:
            for kind in sorted(kinds & set(KIND_COLUMNS)):
                cols = ", ".join(f'"{c}"' for c in KIND_COLUMNS[kind] if c in present)
                sql = f"insert into log_{kind} by name select {cols} from {relation} where kind = ?"
                self.con.execute(sql, [kind])
        finally:
            if incoming is not None and self._registers:
                self.con.unregister("incoming")

    def typed_views(self, rows: dict[str, tuple[str, set[str] | None]]) -> str:
        """The statements replacing each table named in ``rows`` by a view of its rows (``rows[table]``: a
        relation - a scan of files, filtered - and the columns present there, None: all), with the
        table's columns and types (a column not present: null)."""
        columns: dict[str, list[tuple[str, str]]] = {}
        found = self.con.execute(
            "select table_name, column_name, data_type from duckdb_columns() where database_name = current_database() "
            "and schema_name = current_schema() order by table_name, column_index"
        ).fetchall()
        for table, column, type_ in found:
            columns.setdefault(table, []).append((column, type_))

        def typed(column: str, type_: str, present: set[str] | None) -> str:
            value = f'"{column}"' if present is None or column in present else "null"
            return f'cast({value} as {type_}) as "{column}"'

        statements = []
        for table, (relation, present) in rows.items():
            cols = ", ".join(typed(c, t, present) for c, t in columns[table])
            statements.append(f"drop table {table}; create view {table} as select {cols} from {relation}")
        return ";\n".join(statements)

    def read_in_place(self, logs: list[tuple[EventLog, int]]) -> dict[str, tuple[str, set[str]]]:
        """Each event table's rows as a relation over the parts of each ``(log, upto)`` up to its seq (read
        where they lie, not checked: for a catalog that only reads views of states derived from those parts),
        for :meth:`typed_views`; each run's tail is set (lower when parts were quarantined since)."""
        bounds = " or ".join(f"(run_id = {sql_text(log.run_id)} and seq <= {int(upto)})" for log, upto in logs)
        dirs = ", ".join(str(log.log_dir) for log, _ in logs)

        def scanned() -> dict[str, tuple[str, set[str]]]:
            parts = {log.run_id: [p for p in log.parts() if p.first <= upto] for log, upto in logs}
            for log, upto in logs:
                if not parts[log.run_id]:
                    raise LogError(f"{log.log_dir}: the log holds no events up to seq {upto} - read it again")
            listed = ", ".join(sql_text(p.path) for run in parts.values() for p in run)
            scan = f"read_parquet([{listed}], union_by_name = true)"
            try:
                present = {d[0] for d in self.con.execute(f"select * from {scan} limit 0").description}
            except duckdb.IOException as err:
                if all(p.path.exists() for run in parts.values() for p in run):
                    raise LogError(f"{dirs}: cannot read the log: {err}") from err
                raise Moved(f"a part was renamed or merged away since the listing ({err})") from err
            self._grow_tail({log.run_id: min(upto, parts[log.run_id][-1].last) for log, upto in logs}, grow=False)
            return {f"log_{k}": (f"{scan} where kind = {sql_text(k)} and ({bounds})", present) for k in KIND_COLUMNS}

        return while_moving(dirs, scanned, "parts kept disappearing while reading - try again")

    def tail_seq(self, run_id: str | None = None) -> int:
        """The largest seq held (of ``run_id``'s events when given; 0 when none; buffered events not counted)."""
        only = "" if run_id is None else f" where run_id = {sql_text(run_id)}"
        return self.con.execute(f"select coalesce(max(seq), 0) from log_tail{only}").fetchall()[0][0]
