"""Derived state that outlives a process: each run's catalog and its views' rows, stored and reused.

Evaluating the views of a run means loading its events and refreshing every
materialized table (seconds a run); a collection of 100 runs paid that on every
read. A *state* is what one run's catalog holds once refreshed under a set of
variables (its *flavour*: evaluated ``now``, or at every recorded decision), kept
under ``<data>/derived/<run_id>/<flavour>/<source>/``:

- ``catalog.duckdb`` - the catalog (the log's light columns, every materialized
  table, the views and macros), the base a grown run's next state starts from;
- ``state.json`` - exactly what it was derived from (below);
- ``views/<view>.parquet`` - a view's rows, ``run_id`` first, written the first time
  a reader asks for that view (a collection reads every run's file of a view in
  one scan, evaluating no view).

A state is keyed by exactly what it came from: the *source* (the run's committed
record of parts - its identity, its last entry, and each live part's name, size and
modification time) and the *flavour* (the digest of the view definitions and the
code deriving them, and the variables' values). A reader uses the state whose key
matches the log as it reads it now and builds one otherwise, so a log that changed
in any way (a part published, merged, quarantined, replaced, or touched) is read
again. A run that grew by appending only (:meth:`ingest.record.Record.extends`)
is caught up from its last state: only the events after that state's tail are
loaded, and only the trees they concern are recomputed.

Nothing here is trusted over the log: deleting ``derived/`` changes no answer,
``replay`` and ``verify`` never read it, and a state is built by loading the parts
(every byte checked against its checksum). A warm read checks the parts' names,
sizes and times, not their bytes: a part changed in place with its size and time
kept is found by ``verify`` and ``replay``, not by a warm read (DECISIONS).

Writes are atomic: a state is built in a temporary directory renamed into place
(two readers building the same state at once: one rename wins, the other's copy is
dropped), a view's file is written under a temporary name and renamed. A reader
never blocks the writer of a run, and never mixes one state's files with another's.
Where ``derived/`` cannot be written, states live in a temporary directory for the
process (and a note says so).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from engine.catalog import KIND_COLUMNS, Catalog
from engine.catalog.definitions import VIEWS_DIR
from engine.runs import recorded_config
from ingest.errors import LogError
from ingest.log import EventLog
from ingest.paths import fsync_dir

DERIVED = "derived"
# Bump when the code that derives a state (the catalog, its tables, their refresh)
# changes what a state holds: every state of an older version is then rebuilt.
VERSION = 1
NOW = {"asof_points": "now"}
AT_DECISIONS = {"asof_points": "decisions"}
_TMP = ".tmp-"


def views_digest(views_dir: Path = VIEWS_DIR) -> str:
    """The digest of what derives a state: every view file, the macros, the event schema, VERSION."""
    h = hashlib.sha256(f"v{VERSION}\n".encode())
    h.update(json.dumps(KIND_COLUMNS, sort_keys=True).encode())
    for path in sorted(Path(views_dir).glob("*.sql")):
        h.update(f"\n{path.name}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def flavour_key(digest: str, variables: dict[str, Any]) -> str:
    """The directory name of the states derived by these views under these variables."""
    text = json.dumps(variables, sort_keys=True, default=str)
    return hashlib.sha256(f"{digest}\n{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Source:
    """What a run's state is derived from: its committed record of parts, as read now."""

    run_id: str
    identity: str  # the record's first entry ("" for a run written before records)
    entries: int
    last_sha: str
    tail: int
    parts: tuple[tuple[str, int, int], ...]  # (name, size, mtime_ns) of each live part, in seq order

    @classmethod
    def of(cls, log: EventLog) -> Source:
        """The source of ``log`` now; LogError when its record or parts cannot be read."""
        record = log.record()
        parts = log.parts()
        stats = []
        for part in parts:
            try:
                st = part.path.stat()
            except FileNotFoundError:  # merged away since the listing: the record moved on
                return cls.of(log)
            stats.append((part.path.name, st.st_size, st.st_mtime_ns))
        if record is None:
            return cls(log.run_id, "", 0, "", parts[-1].last if parts else 0, tuple(stats))
        return cls(log.run_id, record.identity, record.entries, record.last_sha, record.tail, tuple(stats))

    @property
    def key(self) -> str:
        text = json.dumps([self.run_id, self.identity, self.entries, self.last_sha, self.tail, self.parts])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "identity": self.identity, "entries": self.entries,
                "last_sha": self.last_sha, "tail": self.tail, "parts": [list(p) for p in self.parts]}  # fmt: skip


@dataclass
class State:
    """One stored state: its directory, and the variables its tables were derived under."""

    run_id: str
    dir: Path
    source: Source
    values: dict[str, Any]  # every variable set (the flavour's and the views' defaults)
    explicit: set[str]

    @property
    def catalog_file(self) -> Path:
        return self.dir / "catalog.duckdb"

    def view_file(self, view: str) -> Path:
        return self.dir / "views" / f"{view}.parquet"


class Derived:
    """The derived states of one data directory, and the work of building them.

    ``loaded``: the events each run's catalogs loaded in this process (a cold build
    loads the whole log, a catch-up only what was appended); ``built``: the states
    built, by how (``cold``, ``caught_up``, ``reflavoured``). Tests count with them.
    """

    def __init__(self, data_dir: Path | str, views_dir: Path = VIEWS_DIR) -> None:
        self.data_dir = Path(data_dir)
        self.views_dir = views_dir
        self.digest = views_digest(views_dir)
        self.root = self._root()
        self.loaded: Counter[str] = Counter()
        self.built: Counter[str] = Counter()
        self.con = duckdb.connect(config={"temp_directory": ""})  # builds states; never queried by users
        self._lock = threading.Lock()
        self._n = 0

    def _root(self) -> Path:
        root = self.data_dir / DERIVED
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root, prefix=_TMP):
                return root
        except OSError as err:
            fallback = Path(tempfile.mkdtemp(prefix="teacher-mcts-derived-"))
            print(f"note: cannot keep derived state in {root} ({err.strerror or err}): it is kept in {fallback} "
                  "for this process only, and every process derives it again", file=sys.stderr)  # fmt: skip
            return fallback

    # -- finding or building a state

    def state(self, log: EventLog, variables: dict[str, Any]) -> State:
        """The state of ``log`` as it is now under ``variables`` (built, or caught up, when none matches).

        LogError when the log cannot be read, its parts are damaged or its recorded
        config is not valid (nothing is stored then).
        """
        flavour = self.root / log.run_id / flavour_key(self.digest, variables)
        for _attempt in range(5):
            source = Source.of(log)
            found = self._read(flavour / source.key, source)
            if found is not None:
                return found
            try:
                state = self._build(log, flavour, variables, self._base(log, flavour, source))
            except (FileNotFoundError, _Moved):  # a base another reader replaced, or the log moved on: again
                continue
            self._drop_old(flavour, keep=state)
            return state
        raise LogError(f"{log.log_dir}: the log kept changing while its derived state was built - try again")

    def find(self, log: EventLog, variables: dict[str, Any]) -> State | None:
        """The stored state of ``log`` as it is now under ``variables``, if there is one (nothing is built)."""
        flavour = self.root / log.run_id / flavour_key(self.digest, variables)
        source = Source.of(log)
        return self._read(flavour / source.key, source)

    def _read(self, path: Path, source: Source) -> State | None:
        try:
            held = json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            return None
        if held.get("source") != source.as_json() or not (path / "catalog.duckdb").is_file():
            return None
        return State(source.run_id, path, source, held["values"], set(held["explicit"]))

    def _base(self, log: EventLog, flavour: Path, now: Source) -> State | None:
        """A stored state a new one may start from: this flavour's, of a record this one extends,
        whose parts that are still live are the files they were (same size and time; a part
        changed in place sends the run back to its log, where its checksum is checked).

        Else the same record's state under other variables (the tables those variables
        make stale are recomputed), else None (built from the log).
        """
        record = log.record()
        if record is None:
            return None
        candidates = []
        for path in sorted(flavour.parent.glob("*/*/state.json")):
            try:
                held = json.loads(path.read_text())
                src = Source(**{k: held["source"][k] for k in ("run_id", "identity", "entries", "last_sha", "tail")},
                             parts=tuple(tuple(p) for p in held["source"]["parts"]))  # fmt: skip
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if src.identity != record.identity or not record.extends(src.entries, src.last_sha):
                continue
            live = {name: stat for name, *stat in now.parts}
            if any(live.get(name, stat) != stat for name, *stat in src.parts):
                continue
            if not (path.parent / "catalog.duckdb").is_file():
                continue
            same = path.parent.parent == flavour
            if not same and (src.entries != record.entries or held.get("digest") != self.digest):
                continue
            candidates.append((same, src.entries, State(src.run_id, path.parent, src, held["values"],
                                                        set(held["explicit"]))))  # fmt: skip
        return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None

    def _build(self, log: EventLog, flavour: Path, variables: dict[str, Any], base: State | None) -> State:
        flavour.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=flavour))
        try:
            with self._lock:
                self._n += 1
                db = f"state_{self._n}"
            catalog_file = tmp / "catalog.duckdb"
            cursor = self.con.cursor()
            opened: list[duckdb.DuckDBPyConnection] = []
            try:
                source, values, explicit, how = self._derive(cursor, db, catalog_file, log, flavour, variables, base,
                                                             opened)  # fmt: skip
            finally:
                for other in opened:
                    other.close()
                with contextlib.suppress(duckdb.Error):
                    cursor.execute("use memory")
                for name in (db, "saved"):
                    with contextlib.suppress(duckdb.Error):
                        cursor.execute(f'detach database if exists "{name}"')
                cursor.close()
            state_json = {"source": source.as_json(), "digest": self.digest, "variables": variables,
                          "values": values, "explicit": sorted(explicit)}  # fmt: skip
            (tmp / "views").mkdir()
            (tmp / "state.json").write_text(json.dumps(state_json, indent=1, default=str) + "\n")
            for path in (catalog_file, tmp / "state.json"):
                with open(path, "rb+") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(tmp)
            final = flavour / source.key
            try:
                os.rename(tmp, final)
            except OSError:  # another reader published the same state first: use theirs
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                fsync_dir(flavour)
                self.built[how] += 1
            found = self._read(final, source)
            if found is None:
                raise LogError(f"{final}: the derived state just written cannot be read back")
            return found
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _derive(self, cursor: duckdb.DuckDBPyConnection, db: str, catalog_file: Path, log: EventLog, flavour: Path,
                variables: dict[str, Any], base: State | None,
                opened: list[duckdb.DuckDBPyConnection]) -> tuple[Source, dict, set, str]:  # fmt: skip
        """Fill ``catalog_file`` with the refreshed catalog of ``log`` (from ``base`` when given)."""
        if base is None:
            catalog = Catalog.inside(cursor, db, self.views_dir)
            opened.append(catalog.con)
            how = "cold"
        else:
            shutil.copyfile(base.catalog_file, catalog_file)
            cursor.execute(f"attach '{_quoted(catalog_file)}' as \"{db}\"")
            cursor.execute(f'use "{db}"')
            catalog = Catalog(cursor, self.views_dir, created=True)
            catalog.variables.restore(base.values, base.explicit)
            how = "caught_up" if base.dir.parent == flavour else "reflavoured"
        before = catalog.tail_seq()
        catalog.load(log)
        recorded_config(catalog, log)
        # The state's source: the record as it is after the load, holding exactly the
        # events loaded (a part published meanwhile: build again from there).
        source = Source.of(log)
        if source.tail != catalog.tail_seq():
            raise _Moved
        self._flavour(catalog, variables)
        catalog.refresh()
        self.loaded[log.run_id] += catalog.tail_seq() - before
        if base is None:
            cursor.execute(f"attach '{_quoted(catalog_file)}' as saved")
            cursor.execute(f'copy from database "{db}" to saved')
        else:
            cursor.execute(f'checkpoint "{db}"')
        return source, catalog.variables.values, catalog.variables.explicit, how

    def _flavour(self, catalog: Catalog, variables: dict[str, Any]) -> None:
        """Set the flavour's variables where they differ (each makes the tables reading it stale)."""
        changed = {k: v for k, v in variables.items() if catalog.variables.values.get(k) != v}
        if changed:
            catalog.variables.set(**changed)

    def _drop_old(self, flavour: Path, keep: State) -> None:
        """Remove the flavour's states older than the newest two besides ``keep``.

        A reader scanning a state that was just replaced keeps it for a while (one that
        finds its files gone reads again).
        """
        held = []
        for path in flavour.iterdir():
            if path == keep.dir or path.name.startswith(_TMP):
                continue
            with_time = path / "state.json"
            held.append((with_time.stat().st_mtime_ns if with_time.exists() else 0, path))
        for _mtime, path in sorted(held, reverse=True)[2:]:
            shutil.rmtree(path, ignore_errors=True)

    # -- a view's rows

    def view_file(self, state: State, view: str) -> Path:
        """The Parquet file of ``view``'s rows in ``state`` (``run_id`` first), written on first use."""
        path = state.view_file(view)
        if path.exists():
            return path
        cursor = self.con.cursor()
        with self._lock:
            self._n += 1
            db = f"view_{self._n}"
        tmp = path.with_name(f"{_TMP}{os.getpid()}-{threading.get_ident()}-{path.name}")
        try:
            cursor.execute(f"attach '{_quoted(state.catalog_file)}' as \"{db}\" (read_only)")
            try:
                cursor.execute(f'use "{db}"')
                for name, value in state.values.items():
                    cursor.execute(f"set variable {name} = ?", [value])
                columns = [d[0] for d in cursor.execute(f"select * from {view} limit 0").description]
                run = "" if "run_id" in columns else f"'{state.run_id}' as run_id, "
                cursor.execute(f"copy (select {run}* from {view}) to '{_quoted(tmp)}' (format parquet)")
            finally:
                cursor.execute("use memory")
                cursor.execute(f'detach "{db}"')
            os.replace(tmp, path)
            return path
        except duckdb.Error as err:
            raise LogError(f"{state.dir}: cannot derive the rows of {view} ({err})") from err
        finally:
            tmp.unlink(missing_ok=True)
            cursor.close()


class _Moved(Exception):
    """The log moved on while a state was built from it."""


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")
