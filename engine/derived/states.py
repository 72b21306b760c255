"""The stored states of one data directory and the verbs on their files: the roots they lie in, the log's source,
a state found and checked, a state stored, a view's rows found, a damaged file noted and dropped.

:class:`States` is what the package's other modules are given (:class:`engine.derived.Derived` is one, with
the catalogs that derive what is missing); it needs no catalog and no DuckDB instance, so a live run's writer
(:mod:`engine.derived.live`) stores its states through one of its own.
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
from typing import Any

import duckdb

from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR, load_graph
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
    DERIVED,
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
from engine.derived.store import collect, publish, write_state
from ingest.errors import LogError
from ingest.paths import TMP_MARK, file_signature, fsync_dir, run_dir, write_atomically

__all__ = ["Held", "States"]


class Held:
    """A catalog in the instance (a database of its own), a lock for its one cursor, and how it was derived."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.lock = threading.Lock()
        self.how = ""
        self.in_place = False  # its events read where they lie: for reading views only

    def close(self) -> None:
        self.catalog.close()


class States:
    """The derived states of one data directory: found, checked, stored and dropped (none derived here).

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
        self._lock = threading.Lock()
        self.checks = Checked()  # the files checked, each by its stat then
        self._listed = Listings()  # each state's views/, listed once while it is unchanged

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
            self.drop(path, str(why))
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
            self.drop(path, problem)
            return None
        return State(
            source.run_id, path, source, variables, held["values"], set(held["explicit"]), dict(held["tables"])
        )

    # -- storing a state

    def store(self, held: Held, source: Source, variables: dict, views=(), batch: dict | None = None) -> State:
        """Write the state of a refreshed catalog (its tables' rows, the rows of ``views``, state.json; ``batch``:
        the run's rows, the catalog holding other runs too: see ``write_state``) into the root that takes it."""
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

    # -- reading a state's files

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

    def checked_tables(self, state: State) -> dict[str, Path]:
        """The state's table files, each checked; Damaged for one damaged, or missing while its state is there."""
        files = state.table_files()
        there = "its state is there" if os.path.lexists(state.dir / STATE_FILE) else None
        for path in files.values():
            self.checks.check(path, state.relative, missing=there)
        return files

    # -- damage

    def forget(self, directory: Path) -> None:
        """Forget what was checked under ``directory`` (it is gone, or no longer to be trusted)."""
        self.checks.forget(directory)

    def drop(self, path: Path, why: str) -> None:
        """Remove a damaged state (one line on stderr); the next read derives it again from the log."""
        self.forget(path)
        self.note(path, why, "dropped")
        shutil.rmtree(path, ignore_errors=True)

    def note(self, path: Path, why: str, what: str) -> None:
        """Say on stderr that a stored file was found damaged (``what``: done with it), and count it in ``dropped``."""
        with self._lock:
            self.dropped.append(f"{path}: {why}")
        print(f"note: derived state {path} {what} ({why}); derived again from the log", file=sys.stderr)
