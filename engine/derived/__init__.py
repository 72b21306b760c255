"""Derived state that outlives a process: each run's materialized tables and its views' rows, stored, checked, reused.

Evaluating the views of a run means loading its events and refreshing every
materialized table (seconds a run); a collection of 100 runs paid that on every
read. A *state* is what one run's catalog computes once refreshed under a set of
variables (its *flavour*: evaluated ``now``, or at every recorded decision), kept
under ``<data>/derived/<run_id>/<flavour>/<source>/``:

- ``tables/<table>-<digest>.parquet`` - each materialized table's rows;
- ``views/<view>-<digest>.parquet`` - a view's rows, ``run_id`` first, written the
  first time a reader asks for that view (a collection reads every run's file of a
  view in one scan, evaluating no view);
- ``state.json`` - exactly what it was derived from (below), its tables' files, and
  its check.

A state holds nothing but what is computed from the log: no event. Whatever needs a
recorded fact (a selection, a turn, a conversation) reads it from the log's parts,
every byte checked against the checksum in the part's name: a catalog opened from a
state (:meth:`Derived.open`) loads the events from the parts and only the tables'
rows from the state.

A state is keyed by exactly what it came from: the *source* (the run's committed
record of parts - its identity, its last entry, and each live part's name, size and
modification time) and the *flavour* (the digest of the view definitions and the
code deriving them, and the variables' values). A reader uses the state whose key
matches the log as it reads it now and builds one otherwise, so a log that changed
in any way (a part published, merged, quarantined, replaced, or touched) is read
again. A run that grew by appending only (:meth:`ingest.record.Record.extends`)
is caught up from its last state: only the trees its new events concern are
recomputed.

Every stored file is checked when read (:mod:`engine.derived.files`): a file's bytes
against the digest its name records (bound to its state, so a file of another run's
state fails), ``state.json`` against its check and the log's source now. A state that
fails - a changed byte, a truncated or missing file, another run's state, another
source's - is dropped with one line on stderr and derived again from the log: the
answer is the log's. A digest stops damage, not someone who rewrites the digests too,
so nothing recorded is decided from a stored state (``reselect``, ``explore --resume``
and campaigns derive from the log), and ``replay`` and ``verify`` never read one.

Writes are atomic: a state is built in a temporary directory renamed into place
(two readers building the same state at once: one rename wins, the other's copy is
dropped), a view's file is written under a temporary name and renamed to its digest's
name. A reader never blocks the writer of a run, and never mixes one state's files with
another's. Where ``derived/`` cannot be written (read-only, full, no permission),
states are kept in a temporary directory of the process (:class:`files.Roots`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog.definitions import VIEWS_DIR, load_graph
from engine.derived.files import (
    Damaged,
    Roots,
    check_named,
    dump_json,
    is_tmp,
    load_json,
    split_name,
    stat_key,
    unwritable,
    write_named,
)
from engine.derived.keys import (
    _TMP,
    AT_DECISIONS,
    DERIVED,
    KEPT_FLAVOURS,
    NOW,
    SOURCE_CACHE,
    STATE_FILE,
    VERSION,
    WIDE_INTEGERS,
    Source,
    State,
    file_stat,
    flavour_key,
    record_stat,
    source_from,
    views_digest,
)
from ingest.errors import LogError
from ingest.faults import crash_point
from ingest.paths import fsync_dir, run_dir

if TYPE_CHECKING:
    from engine.catalog import Catalog
    from ingest.reader import EventLog

__all__ = ["AT_DECISIONS", "NOW", "Derived", "Source", "State", "views_digest"]

OPEN_KEPT = 2  # catalogs of stored states kept open per process, for the rows of the next views asked


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
        self._lock = threading.Lock()
        self._n = 0
        self._verified: dict[Path, tuple] = {}  # file -> its stat when its digest was checked
        self._open: OrderedDict[Path, _Open] = OrderedDict()  # state dir -> its catalog (the newest last)

    @property
    def root(self) -> Path:
        """``<data>/derived`` (where states are kept unless it cannot be written)."""
        return self.roots.primary

    def run_dirs(self, run_id: str) -> list[Path]:
        """Every directory a run's states may lie in (one per root), existing or not."""
        return [root / run_id for root in self.roots.all]

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
        except Damaged as why:
            self._note(cache, str(why), "dropped")
            with contextlib.suppress(OSError):
                cache.unlink(missing_ok=True)
            held = {}
        if held.get("record") == list(record):
            with contextlib.suppress(KeyError, TypeError, OSError):
                src = source_from(held["source"])
                if src.run_id == run_id and all(list(file_stat(log_dir / n)) == stat for n, *stat in src.parts):
                    return src
        src = Source.of(self.data_dir, run_id)
        if record_stat(log_dir) == record and self.root.is_dir():  # a cache: never the reason derived/ is made
            body = dump_json(f"{run_id}/{SOURCE_CACHE}", {"record": list(record), "source": src.as_json()})
            with contextlib.suppress(OSError):  # a cache: not kept is only slower
                cache.parent.mkdir(exist_ok=True)
                tmp = cache.with_name(f".{SOURCE_CACHE}{_TMP}{os.getpid()}-{threading.get_ident()}")
                tmp.write_text(body)
                os.replace(tmp, cache)
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
        for attempt in range(5):
            if source is None or attempt:
                source = self.source(run_id)
            found = self.find(run_id, variables, source)
            if found is not None:
                return found
            from ingest.reader import EventLog

            log = EventLog(self.data_dir, run_id)
            try:
                held = self._derive(log, source, variables)
            except (FileNotFoundError, _Moved):  # the log moved on, or a base another reader replaced: again
                continue
            try:
                state = self._store(held, source, variables)
                for view in views:
                    if self._stored_view(state, view) is None:
                        self._derive_view(state, view, held)
            except BaseException:
                held.close()
                raise
            self._keep_open(state.dir, held)
            return state
        raise LogError(f"{run_dir(self.data_dir, run_id) / 'log'}: the log kept changing while its state was derived")

    def _derive(self, log: EventLog, source: Source, variables: dict[str, Any]) -> _Open:
        """A catalog of ``log`` refreshed up to ``source``'s tail under ``variables``: from a stored state it
        extends (caught up), else from the log alone (cold)."""
        from engine.runs import recorded_config

        base = self._base(log, flavour_key(self.digest, variables), source)
        held = self._new_open()
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
                    held = self._new_open()
                    catalog = held.catalog
            before = catalog.tail_seq()
            catalog.load(log, upto=source.tail)  # the source's events, whatever was published since
            recorded_config(catalog, log)
            if catalog.tail_seq() != source.tail:  # its parts quarantined meanwhile: read the log again
                raise _Moved
            self._flavour(catalog, variables)
            catalog.refresh()
            with self._lock:
                self.loaded[log.run_id] += catalog.tail_seq() - before
            held.how = how
            return held
        except BaseException:
            held.close()
            raise

    def _restore(self, catalog: Catalog, log: EventLog, state: State) -> None:
        """Fill an empty catalog with a stored state: its events from the parts, its tables' rows from its
        files (each checked: Damaged when one is not what its name records); _Moved when the log no longer
        holds the state's events (a part quarantined since)."""
        files = state.table_files()
        for path in files.values():
            self._check(path, state.relative)
        catalog.restore(log, state.source.tail, files, state.values, state.explicit)
        if catalog.tail_seq() != state.source.tail:
            raise _Moved

    def _base(self, log: EventLog, flavour: str, now: Source) -> State | None:
        """A stored state a new one may start from: this flavour's, of a record this one extends,
        whose parts that are still live are the files they were (same size and time; a part
        changed in place sends the run back to its log, where its checksum is checked).

        Else such a state under other variables (the tables the variables that differ
        make stale are recomputed), else None (built from the log).
        """
        record = log.record()
        if record is None:
            return None
        candidates = []
        live = {name: stat for name, *stat in now.parts}
        for run in self.run_dirs(log.run_id):
            for path in sorted(run.glob(f"*/*/{STATE_FILE}")):
                relative = f"{log.run_id}/{path.parent.parent.name}/{path.parent.name}"
                try:
                    held = load_json(path, relative)
                    src = source_from(held["source"])  # type: ignore[index]
                except (Damaged, KeyError, TypeError, ValueError):
                    continue
                if held.get("format") != VERSION or held.get("digest") != self.digest or src.run_id != log.run_id:
                    continue
                if src.identity != record.identity or not record.extends(src.entries, src.last_sha):
                    continue
                if any(live.get(name, stat) != stat for name, *stat in src.parts):
                    continue
                if set(held.get("tables") or {}) != set(self.tables):
                    continue
                same = path.parent.parent.name == flavour
                state = State(
                    src.run_id,
                    path.parent,
                    src,
                    held.get("variables") or {},
                    held["values"],
                    set(held["explicit"]),
                    dict(held["tables"]),
                )
                candidates.append((same, src.entries, state))
        return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None

    def _flavour(self, catalog: Catalog, variables: dict[str, Any]) -> None:
        """Set the flavour's variables where they differ, and reset those a base's caller set that this
        flavour does not (each makes the tables reading it stale)."""
        changed = {k: v for k, v in variables.items() if catalog.variables.values.get(k) != v}
        held = catalog.variables.values
        changed |= {k: None for k in catalog.variables.explicit - set(variables) if k in held}
        if changed:
            catalog.variables.set(**changed)

    def _store(self, held: _Open, source: Source, variables: dict[str, Any]) -> State:
        """Write the state of a refreshed catalog (its tables' rows, state.json) into the root that takes it."""
        run_id, flavour = source.run_id, flavour_key(self.digest, variables)
        while True:
            root = self.roots.writable
            place = root / run_id / flavour
            final = place / source.key
            try:
                place.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=place))
                try:
                    self._write_state(held, tmp, f"{run_id}/{flavour}/{source.key}", source, variables)
                    crash_point("derived.built")
                    published = _publish(tmp, final)
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
            if found is None:  # another reader's copy won the rename and was not whole: ours again
                continue
            self._collect(place, keep=found)
            return found

    def _write_state(self, held: _Open, tmp: Path, relative: str, source: Source, variables: dict[str, Any]) -> None:
        catalog = held.catalog
        (tmp / "tables").mkdir()
        (tmp / "views").mkdir()
        tables = {}
        for name in catalog.tables:
            tables[name] = self._write_rows(catalog.con, tmp / "tables", name, relative).name
        body = {
            "format": VERSION,
            "run_id": source.run_id,
            "source": source.as_json(),
            "digest": self.digest,
            "variables": variables,
            "values": catalog.variables.values,
            "explicit": sorted(catalog.variables.explicit),
            "tables": tables,
        }
        body = json.loads(json.dumps(body, default=str))  # as read back
        (tmp / STATE_FILE).write_text(dump_json(relative, body))
        with open(tmp / STATE_FILE, "rb") as fh:
            os.fsync(fh.fileno())
        for directory in (tmp / "tables", tmp / "views", tmp):
            fsync_dir(directory)

    def _write_rows(self, con: duckdb.DuckDBPyConnection, directory: Path, name: str, relative: str, run=None) -> Path:
        """The rows of relation ``name`` (a table, or a view with ``run_id`` added first when ``run``) as a
        digest-named Parquet file in ``directory``."""
        described = con.execute(f"select * from {name} limit 0").description
        names = [d[0] for d in described]
        first = f"'{run}' as run_id, " if run is not None and "run_id" not in names else ""
        # Parquet has no 128-bit integer: a sum DuckDB types HUGEINT would come back a
        # DOUBLE (1714.0). Stored as BIGINT, it reads back the integer it is.
        cols = ", ".join(
            f'cast("{n}" as bigint) as "{n}"' if str(t) in WIDE_INTEGERS else f'"{n}"' for n, t, *_ in described
        )
        copy = f"copy (select {first}{cols} from {name}) to '{{}}' (format parquet, compression zstd)"
        return write_named(directory, name, relative, lambda tmp: con.execute(copy.format(_quoted(tmp))))

    def _collect(self, flavour: Path, keep: State) -> None:
        """Remove what no reader of these views will read again: the flavour's states but ``keep``
        and the newest other (a reader may still be scanning one just replaced: one that finds
        its files gone reads again), the run's flavours derived by other views or code, all but
        the newest KEPT_FLAVOURS others of variables set by a caller (now and at decisions stay),
        and temporary directories a killed builder left (older than an hour)."""
        run = flavour.parent
        mine = {flavour_key(self.digest, NOW), flavour_key(self.digest, AT_DECISIONS), flavour.name}
        others = []
        for path in run.iterdir():
            if path.name.startswith(_TMP) or not path.is_dir():
                continue
            states = sorted(((_mtime(p), p.parent) for p in path.glob(f"*/{STATE_FILE}")), reverse=True)
            if not states:  # nothing stored yet (another reader may be building its first state)
                continue
            if _digest_of(states[0][1]) != self.digest:
                shutil.rmtree(path, ignore_errors=True)
            elif path == flavour:
                for _when, old in [s for s in states if s[1] != keep.dir][1:]:
                    shutil.rmtree(old, ignore_errors=True)
            elif path.name not in mine:
                others.append((states[0][0], path))
        for _when, path in sorted(others, reverse=True)[KEPT_FLAVOURS:]:
            shutil.rmtree(path, ignore_errors=True)
        cutoff = time.time() - 3600
        for tmp in [*run.glob(f"*/{_TMP}*"), *run.glob("*/*/views/.*")]:
            with contextlib.suppress(OSError):
                if is_tmp(tmp.name) and tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()

    # -- reading a state

    def view_file(self, state: State, view: str) -> Path:
        """The checked Parquet file of ``view``'s rows in ``state`` (``run_id`` first), written on first use.

        A state found damaged or gone meanwhile is derived again (the file is then the new
        state's). LogError when the view cannot be evaluated.
        """
        for _attempt in range(5):
            found = self._stored_view(state, view)
            if found is not None:
                return found
            try:
                return self._derive_view(state, view)
            except (Damaged, _Moved, FileNotFoundError) as why:
                if isinstance(why, Damaged):
                    self._drop(state.dir, str(why))
                self._forget(state.dir)
                state = self.state(state.run_id, state.variables)
        raise LogError(f"{state.dir}: the run's state kept changing while the rows of {view} were derived")

    def _stored_view(self, state: State, view: str) -> Path | None:
        """A checked file of ``view``'s rows of ``state`` in any root (a damaged one is removed, with a note)."""
        for root in self.roots.all:
            directory = root / state.relative / "views"
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for path in sorted(directory.glob(f"{view}-*.parquet")):
                    parsed = split_name(path.name)
                    if parsed is None or parsed[0] != view:
                        continue
                    try:
                        self._check(path, state.relative)
                    except Damaged as why:
                        self._note(path, str(why), "dropped")
                        path.unlink(missing_ok=True)
                        continue
                    return path
        return None

    def _derive_view(self, state: State, view: str, held: _Open | None = None) -> Path:
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
                        path = self._write_rows(held.catalog.con, directory, view, state.relative, run=state.run_id)
                        break
                    except (OSError, duckdb.Error) as err:
                        if not unwritable(err):
                            if isinstance(err, duckdb.Error):
                                raise LogError(f"{state.dir}: cannot derive the rows of {view} ({err})") from err
                            raise
                        root = next((r for r in self.roots.all if directory.is_relative_to(r)), self.roots.writable)
                        self.roots.refused(root, err)
                        directory = self.roots.writable / state.relative / "views"
        finally:
            if mine:
                self._keep_open(state.dir, held)
        with self._lock:
            self._verified[path] = stat_key(path)
        return path

    def open(self, run_id: str, variables: dict[str, Any] | None = None) -> Catalog:
        """A catalog holding a run's state under ``variables`` (default: now), in memory, its own.

        Its events are read from the log's parts, its tables' rows from the stored state
        (checked); its variables may be set (the tables they make stale are recomputed
        there, never in the stored state). ``close()`` it when done.
        """
        for _attempt in range(5):
            state = self.state(run_id, variables or NOW)
            with self._lock:
                held = self._open.pop(state.dir, None)
            if held is not None:
                return held.catalog
            try:
                return self._opened(state, keep=False).catalog
            except (Damaged, _Moved, FileNotFoundError) as why:
                if isinstance(why, Damaged):
                    self._drop(state.dir, str(why))
        raise LogError(f"{run_dir(self.data_dir, run_id) / 'log'}: the log kept changing while its state was read")

    # -- catalogs of states, and checks

    def _new_open(self) -> _Open:
        from engine.catalog import Catalog

        with self._lock:  # the instance's template of the views, made once (not by two threads at once)
            self._n += 1
            n = self._n
            own = self.con.cursor()  # a connection busy in one thread refuses another's statements
            Catalog.template(own, self.views_dir)
        return _Open(Catalog.inside(own, f"state_{n}", self.views_dir))  # (its cursor lives on own's connection)

    def _opened(self, state: State, keep: bool = True) -> _Open:
        """The catalog of a stored state: open already, else restored (Damaged, _Moved as :meth:`_restore`)."""
        with self._lock:
            held = self._open.pop(state.dir, None) if keep else None
        if held is not None:
            return held
        from ingest.reader import EventLog

        held = self._new_open()
        try:
            self._restore(held.catalog, EventLog(self.data_dir, state.run_id), state)
        except BaseException:
            held.close()
            raise
        return held

    def _keep_open(self, directory: Path, held: _Open) -> None:
        with self._lock:
            old = self._open.pop(directory, None)
            self._open[directory] = held
            dropped = [old] if old is not None and old is not held else []
            while len(self._open) > OPEN_KEPT:
                dropped.append(self._open.popitem(last=False)[1])
        for other in dropped:
            other.close()

    def _forget(self, directory: Path) -> None:
        with self._lock:
            held = self._open.pop(directory, None)
            for path in [p for p in self._verified if p.is_relative_to(directory)]:
                del self._verified[path]
        if held is not None:
            held.close()

    def _check(self, path: Path, relative: str) -> None:
        """Damaged unless ``path`` holds the bytes its name records (checked once while the file is unchanged)."""
        before = stat_key(path)
        if before is not None and self._verified.get(path) == before:
            return
        check_named(path, relative)
        if stat_key(path) == before:
            with self._lock:
                self._verified[path] = before

    def unchanged(self, path: Path) -> bool:
        """Whether a file checked by this instance is still the file it checked (its size, times, inode)."""
        return path in self._verified and stat_key(path) == self._verified[path]

    def _drop(self, path: Path, why: str) -> None:
        """Remove a damaged state (one line on stderr); the next read derives it again from the log."""
        self._forget(path)
        self._note(path, why, "dropped")
        shutil.rmtree(path, ignore_errors=True)

    def _note(self, path: Path, why: str, what: str) -> None:
        with self._lock:
            self.dropped.append(f"{path}: {why}")
        print(f"note: derived state {path} {what} ({why}); derived again from the log", file=sys.stderr)

    def close(self) -> None:
        """Drop the catalogs kept open."""
        with self._lock:
            held, self._open = list(self._open.values()), OrderedDict()
        for h in held:
            h.close()


class _Open:
    """A catalog in the instance's connection (a database of its own), and a lock for its one cursor."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.lock = threading.Lock()
        self.how = ""

    def close(self) -> None:
        self.catalog.close()


class _Moved(Exception):
    """The log moved on while a state was built from it."""


def _publish(tmp: Path, final: Path) -> bool:
    """Rename a built state into place; False when another reader's is there already (theirs is used)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():
            return False
        raise
    return True


def _digest_of(state_dir: Path) -> str | None:
    try:
        return json.loads((state_dir / STATE_FILE).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")
