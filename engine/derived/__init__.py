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

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog import sandbox
from engine.catalog.definitions import VIEWS_DIR, load_graph
from engine.derived.catalogs import template_dir
from engine.derived.files import (
    Checked,
    Damaged,
    Listings,
    Outdated,
    Roots,
    discard,
    dump_json,
    load_json,
    unwritable,
)
from engine.derived.keys import (
    AT_DECISIONS,
    DERIVED,
    NOW,
    SOURCE_CACHE,
    STATE_FILE,
    VERSION,
    Source,
    State,
    flavour_key,
    record_stat,
    source_from,
    views_digest,
)
from ingest.errors import LogError
from ingest.listing import Moved, while_moving
from ingest.paths import TMP_MARK, file_signature, fsync_dir, run_dir, write_atomically

if TYPE_CHECKING:
    from engine.catalog import Catalog
    from engine.derived.catalogs import Catalogs, Held
    from engine.derived.inspect import StoredState
    from ingest.reader import EventLog

__all__ = ["AT_DECISIONS", "NOW", "Derived", "Source", "State", "views_digest"]


class Derived:
    """The derived states of one data directory, and the work of building, checking and reading them.

    ``loaded``: the events each run's states took in from the log in this process
    beyond the state they started from (a cold build: the whole log, a catch-up: what
    was appended); ``built``: the states built, by how (``cold``, ``caught_up``,
    ``reflavoured``); ``dropped``: the stored states dropped as damaged, each with why.
    Tests count with them.
    """

    def __init__(self, data_dir: Path | str, views_dir: Path = VIEWS_DIR) -> None:
        self.data_dir = Path(data_dir)
        self.views_dir = views_dir
        self.digest = views_digest(views_dir)
        self.tables = load_graph(views_dir).tables
        self.roots = Roots(self.data_dir / DERIVED)
        self.loaded: Counter[str] = Counter()
        self.built: Counter[str] = Counter()
        self.dropped: list[str] = []
        self.con = duckdb.connect(config={"temp_directory": ""})  # builds states; never queried by users
        self.con.execute("set global parquet_metadata_cache = true")  # every cursor's (parts, tables read in place)
        # The runs' logs, their states (in every root it may use) and this user's template of the views: nothing else.
        sandbox(self.con, [self.data_dir / "runs", *self.roots.candidates, template_dir(self.digest)])
        self._lock = threading.Lock()
        self.checks = Checked()  # the files checked, each by its stat then
        self._listed = Listings()  # each state's views/, listed once while it is unchanged
        self._catalogs: Catalogs | None = None  # of stored states, kept for their next views (made when needed)

    @property
    def catalogs(self) -> Catalogs:
        """The catalogs of stored states this process made (imported and made on first use: a warm read
        of stored rows needs none)."""
        if self._catalogs is None:
            from engine.derived.catalogs import Catalogs, stored_template

            with self._lock:
                if self._catalogs is None:
                    self._catalogs = Catalogs(self.con, self.views_dir, lambda cursor: stored_template(self, cursor))
        return self._catalogs

    @property
    def root(self) -> Path:
        """``<data>/derived`` (where states are kept unless it cannot be written)."""
        return self.roots.primary

    def run_dirs(self, run_id: str) -> list[Path]:
        """Every directory a run's states lie in (one per root made)."""
        return [root / run_id for root in self.roots.all]

    def allowed_dirs(self, run_id: str) -> list[Path]:
        """Every directory a run's states may lie in during this process (one per root it may make)."""
        return [root / run_id for root in self.roots.candidates]

    # -- the log's source

    def source(self, run_id: str) -> Source:
        """:meth:`Source.of` the run, without parsing its record again while the record file is the
        one last parsed (its size, time and inode: the record is append-only) and its parts are
        the files they were; ``<derived>/<run>/source.json`` keeps the last one parsed (checked)."""
        log_dir = run_dir(self.data_dir, run_id) / "log"
        record = record_stat(log_dir)
        if record is None:
            return Source.of(self.data_dir, run_id)
        cache = self.root / run_id / SOURCE_CACHE
        try:
            held = load_json(cache, f"{run_id}/{SOURCE_CACHE}") or {}
        except Outdated:
            held = {}  # (replaced below)
        except Damaged as why:
            self.note(cache, str(why), "dropped")
            with contextlib.suppress(OSError):
                discard(cache)
            held = {}
        if held.get("record") == list(record):
            with contextlib.suppress(KeyError, TypeError, OSError):
                src = source_from(held["source"])
                same = all(list(file_signature(log_dir / n, portable=True)) == stat for n, *stat in src.parts)
                if src.run_id == run_id and same:
                    return src
        src = Source.of(self.data_dir, run_id)
        if record_stat(log_dir) == record and self.root.is_dir():  # a cache: never the reason derived/ is made
            body = dump_json(f"{run_id}/{SOURCE_CACHE}", {"record": list(record), "source": src.as_json()})
            with contextlib.suppress(OSError):  # a cache: not kept is only slower
                cache.parent.mkdir(exist_ok=True)
                write_atomically(cache, body, durable=False)
        return src

    # -- finding a state

    def find(self, run_id: str, variables: dict[str, Any], source: Source | None = None) -> State | None:
        """The stored state of a run's log as it is now (``source``: just read, else read here) under
        ``variables``, checked, if there is one (nothing is built; a damaged one is dropped)."""
        source = source or self.source(run_id)
        flavour = flavour_key(self.digest, variables)
        for root in self.roots.all:
            found = self._read(root / run_id / flavour / source.key, source, variables)
            if found is not None:
                return found
        return None

    def checked(self, run_id: str) -> bool:
        """Whether some stored state of these views was derived from a run's log as it is now (its
        parts were checked then, and are the same files: a reader need not check them again)."""
        source = self.source(run_id)
        for run in self.run_dirs(run_id):
            for path in run.glob(f"*/{source.key}/{STATE_FILE}"):
                with contextlib.suppress(Damaged):
                    held = load_json(path, f"{run_id}/{path.parent.parent.name}/{source.key}") or {}
                    if held.get("source") == source.as_json() and held.get("digest") == self.digest:
                        return True
        return False

    def _read(self, path: Path, source: Source, variables: dict[str, Any]) -> State | None:
        """The state stored at ``path`` for ``source`` (None: none there); a damaged one is dropped."""
        relative = f"{source.run_id}/{path.parent.name}/{path.name}"
        try:
            held = load_json(path / STATE_FILE, relative)
        except Damaged as why:
            self._drop(path, str(why))
            return None
        if held is None:
            return None
        problem = None
        if held.get("format") != VERSION or held.get("run_id") != source.run_id:
            problem = "not a state of this run by this version"
        elif held.get("source") != source.as_json():
            problem = "derived from another state of the log than the run's now"
        elif held.get("digest") != self.digest or held.get("variables") != json.loads(json.dumps(variables)):
            problem = "derived by other views or under other variables than its place says"
        elif set(held.get("tables") or {}) != set(self.tables):
            problem = "its tables are not the views' materialized tables"
        if problem:
            self._drop(path, problem)
            return None
        return State(
            source.run_id, path, source, variables, held["values"], set(held["explicit"]), dict(held["tables"])
        )

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
        from engine.derived.store import base_state, set_flavour

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
                    self._drop(base.dir, str(why))
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

    def store(self, held: Held, source: Source, variables: dict, views=(), batch: dict | None = None) -> State:
        """Write the state of a refreshed catalog (its tables' rows, the rows of ``views``, state.json; ``batch``:
        the run's rows, the catalog holding other runs too: see ``write_state``) into the root that takes it."""
        from engine.derived.store import collect, publish, write_state
        from ingest.faults import crash_point

        run_id, flavour = source.run_id, flavour_key(self.digest, variables)
        for _attempt in range(8):  # (each root refused, or another reader's copy found not whole, is one)
            root = self.roots.writable
            place = root / run_id / flavour
            final = place / source.key
            try:
                place.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_MARK}{os.getpid()}-", dir=place))
                try:
                    relative = f"{run_id}/{flavour}/{source.key}"
                    write_state(held.catalog, tmp, relative, source, variables, self.digest, views=views, batch=batch)
                    crash_point("derived.built")
                    published = publish(tmp, final)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)  # (gone once renamed)
            except (OSError, duckdb.Error) as err:
                if not unwritable(err):
                    raise
                self.roots.refused(root, err)  # (raises when no other root can be made)
                continue
            if published:
                with contextlib.suppress(OSError):
                    fsync_dir(place)
                with self._lock:
                    self.built[held.how] += 1
            found = self._read(final, source, variables)
            if found is None:  # another reader's copy won the rename and was not whole (dropped): ours again
                shutil.rmtree(final, ignore_errors=True)
                continue
            collect(place, found, self.digest)
            return found
        raise LogError(f"{self.root / run_id}: its derived state could not be stored whole - try again")

    def inspect(self, run_id: str) -> list[StoredState]:
        """Every state stored for a run, checked whole (``verify``; nothing is changed)."""
        from engine.derived.inspect import inspect

        return inspect(self, run_id)

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
                    self._drop(state.dir, str(why))
                self._forget(state.dir)
                state = self.state(state.run_id, state.variables)
                raise Moved(str(why)) from why

        hint = f"the run's state kept changing while the rows of {view} were derived - try again"
        return while_moving(state.dir, rows, hint)

    def stored_view(self, state: State, view: str) -> Path | None:
        """A checked file of ``view``'s rows of ``state`` in any root (a damaged one is removed, with a note)."""
        for root in self.roots.all:
            directory = root / state.relative / "views"
            for name in self._listed.files(directory).get(view, ()):
                path = directory / name
                try:
                    self.checks.check(path, state.relative)
                except FileNotFoundError:
                    continue
                except Damaged as why:
                    self.note(path, str(why), "dropped")
                    discard(path)
                    continue
                return path
        return None

    def _derive_view(self, state: State, view: str, held: Held | None = None) -> Path:
        """Write ``view``'s rows of ``state`` from its catalog (``held``, else the one kept open, else
        restored): into the state's directory, or where a root takes it."""
        from engine.derived.store import write_rows

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
                self._drop(state.dir, str(why))
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

    def _forget(self, directory: Path) -> None:
        if self._catalogs is not None:
            self._catalogs.forget(directory)
        self.checks.forget(directory)

    def checked_tables(self, state: State) -> dict[str, Path]:
        """The state's table files, each checked; Damaged for one damaged, or missing while its state is there."""
        files = state.table_files()
        there = "its state is there" if os.path.lexists(state.dir / STATE_FILE) else None
        for path in files.values():
            self.checks.check(path, state.relative, missing=there)
        return files

    def _drop(self, path: Path, why: str) -> None:
        """Remove a damaged state (one line on stderr); the next read derives it again from the log."""
        self._forget(path)
        self.note(path, why, "dropped")
        shutil.rmtree(path, ignore_errors=True)

    def note(self, path: Path, why: str, what: str) -> None:
        """Say on stderr that a stored file was found damaged (``what``: done with it), and count it in ``dropped``."""
        with self._lock:
            self.dropped.append(f"{path}: {why}")
        print(f"note: derived state {path} {what} ({why}); derived again from the log", file=sys.stderr)

    def close(self) -> None:
        """Drop the catalogs kept open."""
        if self._catalogs is not None:
            self._catalogs.close()
