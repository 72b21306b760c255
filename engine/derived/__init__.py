"""Derived state that outlives a process: each run's materialized tables and its views' rows, stored, checked, reused.

A *state* is what one run's catalog computes once refreshed under a set of variables
(its *flavour*: evaluated ``now``, or at every recorded decision, or under a caller's
weights), kept under ``<data>/derived/<run_id>/<flavour>/<source>/``:
``tables/<table>-<digest>.parquet`` (each materialized table's rows),
``views/<view>-<digest>.parquet`` (a view's rows, ``run_id`` first, written the first
time a reader asks for it) and ``state.json`` (what it was derived from, its check).

A state holds nothing but what is computed from the log, never an event: whatever
needs a recorded fact reads it from the log's parts. It is keyed by exactly what it
came from - the run's committed record of parts (*source*), the views' and the code's
digest and the variables (*flavour*) - and every file is checked against its digest
when read (:mod:`engine.derived.files`): a state that fails is dropped with one line on
stderr and derived again, so deleting or damaging ``derived/`` changes no answer. A
run that grew by appending is caught up from its last state (only the trees its new
events concern are recomputed). Nothing recorded is decided from a stored state.
Writes are atomic (temporary names renamed into place); where ``derived/`` cannot be
written, states live in a temporary directory of the process. DECISIONS, "Derived
state", says why each of these is so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog import Catalog, sandbox
from engine.catalog.definitions import VIEWS_DIR
from engine.derived.catalogs import Catalogs, stored_template, template_dir
from engine.derived.files import Damaged, unwritable
from engine.derived.inspect import StoredState
from engine.derived.inspect import inspect as inspect_run
from engine.derived.keys import AT_DECISIONS, NOW, Source, State, flavour_key, views_digest
from engine.derived.states import Held, States
from engine.derived.store import base_state, set_flavour, write_rows
from ingest.errors import LogError
from ingest.listing import Moved, while_moving
from ingest.paths import run_dir

if TYPE_CHECKING:  # (a type only: the log's reader loads Arrow, which reading stored state never needs)
    from ingest.reader import EventLog

__all__ = ["AT_DECISIONS", "NOW", "Derived", "Source", "State", "views_digest"]


class Derived(States):
    """The derived states of one data directory (:class:`States`: found, checked, stored), and the catalogs
    that build what is missing and read them."""

    def __init__(self, data_dir: Path | str, views_dir: Path = VIEWS_DIR) -> None:
        super().__init__(data_dir, views_dir)
        self.con = duckdb.connect(config={"temp_directory": ""})  # builds states; never queried by users
        self.con.execute("set global parquet_metadata_cache = true")  # every cursor's (parts, tables read in place)
        # The runs' logs, their states (in every root it may use) and this user's template of the views: nothing else.
        sandbox(self.con, [self.data_dir / "runs", *self.roots.candidates, template_dir(self.digest)])
        self._catalogs: Catalogs | None = None  # of stored states, kept for their next views (made when needed)

    @property
    def catalogs(self) -> Catalogs:
        """The catalogs of stored states this process made (made on first use: a warm read of stored rows
        needs none)."""
        if self._catalogs is None:
            with self._lock:
                if self._catalogs is None:
                    self._catalogs = Catalogs(self.con, self.views_dir, lambda cursor: stored_template(self, cursor))
        return self._catalogs

    # -- building a state

    def state(
        self, run_id: str, variables: dict[str, Any], source: Source | None = None, views: tuple[str, ...] = ()
    ) -> State:
        """The state of a run's log as it is now under ``variables`` (built, or caught up, when none matches).

        ``source``: the log's, just read (else it is read here); ``views``: the rows of these
        views are written with a state built now (from the catalog in hand). LogError when the log
        cannot be read, its parts are damaged or its recorded config is not valid
        (nothing is stored then).
        """
        given = [source]

        def derived() -> State:  # (Moved, FileNotFoundError: the log moved on, or a base another reader replaced)
            source = given.pop() if given else None
            source = source or self.source(run_id)
            found = self.find(run_id, variables, source)
            if found is not None:
                return found
            from ingest.reader import EventLog

            held = self._derive(EventLog(self.data_dir, run_id), source, variables)
            try:
                state = self.store(held, source, variables)
                for view in views:
                    if self.stored_view(state, view) is None:
                        self._derive_view(state, view, held)
            except BaseException:
                held.close()
                raise
            self.catalogs.keep(state.dir, held)
            self.source(run_id)  # (its cache kept, derived/ made now: a live writer's sign that the run is read)
            return state

        log_dir = run_dir(self.data_dir, run_id) / "log"
        return while_moving(log_dir, derived, "the log kept changing while its state was derived - try again")

    def _derive(self, log: EventLog, source: Source, variables: dict[str, Any]) -> Held:
        """A catalog of ``log`` refreshed up to ``source``'s tail under ``variables``: from a stored state it
        extends (caught up), else from the log alone (cold)."""
        base = base_state(
            self.run_dirs(log.run_id), log, flavour_key(self.digest, variables), source, self.digest, self.tables
        )
        held = self.catalogs.new()
        try:
            catalog = held.catalog
            how = "cold"
            if base is not None:
                try:
                    self._restore(catalog, log, base)
                    how = "caught_up" if base.variables == variables else "reflavoured"
                except Damaged as why:  # the base is not what it says: from the log alone, the base dropped
                    self.drop(base.dir, str(why))
                    held.close()
                    held = self.catalogs.new()
                    catalog = held.catalog
            before = catalog.tail_seq()
            catalog.load(log, upto=source.tail)  # the source's events, whatever was published since
            if how == "cold":  # a base was stored once the same code (keys.CODE) accepted the same first event
                from engine.config import recorded_config  # (pydantic: 0.17 s a catch-up does not pay)

                recorded_config(catalog, log)
            if catalog.tail_seq() != source.tail:  # its parts quarantined meanwhile: read the log again
                raise Moved("its parts were quarantined while read")
            set_flavour(catalog, variables)
            catalog.refresh()
            with self._lock:
                self.loaded[log.run_id] += catalog.tail_seq() - before
            held.how = how
            return held
        except BaseException:
            held.close()
            raise

    def _restore(self, catalog: Catalog, log: EventLog, state: State, in_place: bool = False) -> None:
        """Fill an empty catalog with a stored state: its events from the parts, its tables' rows from its
        files (each checked: Damaged when one is not what its name records); Moved when the log no longer
        holds the state's events (a part quarantined since). ``in_place``: both read where they lie
        (:meth:`Catalog.restore`), for a catalog that only reads views."""
        files = self.checked_tables(state)
        tables = {name: [path] for name, path in files.items()}
        catalog.restore([(log, state.source.tail)], tables, state.values, state.explicit, in_place)
        if catalog.tail_seq() != state.source.tail:
            raise Moved("the log no longer holds the state's events (a part quarantined since)")

    def inspect(self, run_id: str) -> list[StoredState]:
        """Every state stored for a run, checked whole (``verify``; nothing is changed)."""
        return inspect_run(self, run_id)

    # -- reading a state

    def view_file(self, state: State, view: str) -> Path:
        """The checked Parquet file of ``view``'s rows in ``state`` (``run_id`` first), written on first use."""
        return self.view_rows(state, view)[1]

    def view_rows(self, state: State, view: str) -> tuple[State, Path]:
        """The checked Parquet file of ``view``'s rows in ``state`` (``run_id`` first), written on first use,
        and the state it belongs to: ``state``, or the one derived again when ``state`` was found damaged or
        gone meanwhile (its other files are gone then too). LogError when the view cannot be evaluated.
        """

        def rows() -> tuple[State, Path]:
            nonlocal state
            found = self.stored_view(state, view)
            if found is not None:
                return state, found
            try:
                return state, self._derive_view(state, view)
            except (Damaged, Moved, FileNotFoundError) as why:
                if isinstance(why, Damaged):
                    self.drop(state.dir, str(why))
                self.forget(state.dir)
                state = self.state(state.run_id, state.variables)
                raise Moved(str(why)) from why

        hint = f"the run's state kept changing while the rows of {view} were derived - try again"
        return while_moving(state.dir, rows, hint)

    def _derive_view(self, state: State, view: str, held: Held | None = None) -> Path:
        """Write ``view``'s rows of ``state`` from its catalog (``held``, else the one kept open, else
        restored): into the state's directory, or where a root takes it."""
        mine = held is None
        held = held or self._opened(state)
        try:
            with held.lock:
                held.catalog.refresh()
                directory = state.dir / "views"
                while True:
                    try:
                        directory.mkdir(parents=True, exist_ok=True)
                        path = write_rows(held.catalog.con, directory, view, state.relative, run=state.run_id)
                        break
                    except (OSError, duckdb.Error) as err:
                        if isinstance(err, duckdb.IOException) and not unwritable(err):
                            raise Moved(str(err)) from err  # a part merged or a file collected since: the state again
                        if not unwritable(err):
                            if isinstance(err, duckdb.Error):
                                raise LogError(f"{state.dir}: cannot derive the rows of {view} ({err})") from err
                            raise
                        root = next((r for r in self.roots.all if directory.is_relative_to(r)), self.roots.writable)
                        self.roots.refused(root, err)
                        directory = self.roots.writable / state.relative / "views"
        finally:
            if mine:
                self.catalogs.keep(state.dir, held)
        self.checks.add(path)
        return path

    def open(self, run_id: str, variables: dict[str, Any] | None = None) -> Catalog:
        """A catalog holding a run's state under ``variables`` (default: now), in memory, its own.

        Its events are read from the log's parts, its tables' rows from the stored state
        (checked); its variables may be set (the tables they make stale are recomputed
        there, never in the stored state). ``close()`` it when done.
        """

        def opened() -> Catalog:
            state = self.state(run_id, variables or NOW)
            try:
                return self._opened(state, in_place=False).catalog
            except Damaged as why:
                self.drop(state.dir, str(why))
                raise Moved(str(why)) from why

        log_dir = run_dir(self.data_dir, run_id) / "log"
        return while_moving(log_dir, opened, "the log kept changing while its state was read - try again")

    # -- catalogs of states, and checks

    def _opened(self, state: State, in_place: bool = True) -> Held:
        """The catalog of a stored state: one open already (``in_place``: any, else one holding the events),
        else restored (Damaged, Moved as :meth:`_restore`)."""
        held = self.catalogs.take(state.dir)
        if held is not None and (in_place or not held.in_place):
            return held
        if held is not None:
            self.catalogs.keep(state.dir, held)
        from ingest.reader import EventLog

        held = self.catalogs.new()
        held.in_place = in_place
        try:
            self._restore(held.catalog, EventLog(self.data_dir, state.run_id), state, in_place)
        except BaseException:
            held.close()
            raise
        return held

    def forget(self, directory: Path) -> None:
        if self._catalogs is not None:
            self._catalogs.forget(directory)
        super().forget(directory)

    def close(self) -> None:
        """Drop the catalogs kept open."""
        if self._catalogs is not None:
            self._catalogs.close()
