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
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from engine.derived.keys import (
    _TMP,
    AT_DECISIONS,
    DERIVED,
    KEPT_FLAVOURS,
    NOW,
    SOURCE_CACHE,
    WIDE_INTEGERS,
    Source,
    State,
    file_stat,
    flavour_key,
    record_stat,
    source_from,
    views_digest,
)
from ingest.errors import LogError, OutputError
from ingest.paths import fsync_dir, run_dir, write_atomically

if TYPE_CHECKING:
    from ingest.reader import EventLog

__all__ = ["AT_DECISIONS", "NOW", "Derived", "Source", "State", "views_digest"]


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
        self.root = self.data_dir / DERIVED  # made when a state is first stored (ensure_root)
        self.loaded: Counter[str] = Counter()
        self.built: Counter[str] = Counter()
        self.con = duckdb.connect(config={"temp_directory": ""})  # builds states; never queried by users
        self._lock = threading.Lock()
        self._n = 0
        self._checked_root = False

    def ensure_root(self) -> Path:
        """Make the root, or (where it cannot be written) move it to a temporary directory, with a note;
        the root states are kept in."""
        if self._checked_root:
            return self.root
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=_TMP):
                pass
        except OSError as err:
            fallback = Path(tempfile.mkdtemp(prefix="teacher-mcts-derived-"))
            print(
                f"note: cannot keep derived state in {self.root} ({err.strerror or err}): it is kept in "
                f"{fallback} for this process only, and every process derives it again",
                file=sys.stderr,
            )
            self.root = fallback
        self._checked_root = True
        return self.root

    # -- finding or building a state

    def state(self, run_id: str, variables: dict[str, Any], source: Source | None = None) -> State:
        """The state of a run's log as it is now under ``variables`` (built, or caught up, when none matches).

        ``source``: the log's, just read (else it is read here). LogError when the log
        cannot be read, its parts are damaged or its recorded config is not valid
        (nothing is stored then).
        """
        self.ensure_root()
        flavour = self.root / run_id / flavour_key(self.digest, variables)
        for attempt in range(5):
            if source is None or attempt:
                source = self.source(run_id)
            found = self._read(flavour / source.key, source)
            if found is not None:
                return found
            from ingest.reader import EventLog

            log = EventLog(self.data_dir, run_id)
            try:
                state = self._build(log, source, flavour, variables, self._base(log, flavour, source))
            except (FileNotFoundError, _Moved):  # a base another reader replaced, or the log moved on: again
                continue
            self._collect(flavour, keep=state)
            return state
        raise LogError(f"{log.log_dir}: the log kept changing while its derived state was built - try again")

    def source(self, run_id: str) -> Source:
        """:meth:`Source.of` the run, without parsing its record again while the record file is the
        one last parsed (its size, time and inode: the record is append-only) and its parts are
        the files they were; ``<derived>/<run>/source.json`` keeps the last one parsed."""
        log_dir = run_dir(self.data_dir, run_id) / "log"
        cache = self.root / run_id / SOURCE_CACHE
        record = record_stat(log_dir)
        if record is None:
            return Source.of(self.data_dir, run_id)
        held: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            held = json.loads(cache.read_text())
        if held.get("record") == list(record):
            with contextlib.suppress(KeyError, TypeError, OSError):
                src = source_from(held["source"])
                if all(list(file_stat(log_dir / name)) == stat for name, *stat in src.parts):
                    return src
        src = Source.of(self.data_dir, run_id)
        if record_stat(log_dir) == record and self._writable_quietly():
            body = json.dumps({"record": list(record), "source": src.as_json()})
            with contextlib.suppress(OSError, OutputError):  # a cache: not kept is only slower
                cache.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(cache, lambda tmp: tmp.write_text(body), "the run's source")
        return src

    def _writable_quietly(self) -> bool:
        return self._checked_root or self.root.is_dir()

    def find(self, run_id: str, variables: dict[str, Any], source: Source | None = None) -> State | None:
        """The stored state of a run's log as it is now (``source``: just read, else read here) under
        ``variables``, if there is one (nothing is built)."""
        flavour = self.root / run_id / flavour_key(self.digest, variables)
        source = source or self.source(run_id)
        return self._read(flavour / source.key, source)

    def checked(self, run_id: str) -> bool:
        """Whether some stored state of these views was derived from a run's log as it is now (its
        parts were checked then, and are the same files: a reader need not check them again)."""
        source = self.source(run_id)
        for path in (self.root / run_id).glob(f"*/{source.key}/state.json"):
            with contextlib.suppress(OSError, ValueError):
                held = json.loads(path.read_text())
                if held.get("source") == source.as_json() and held.get("digest") == self.digest:
                    return True
        return False

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

        Else such a state under other variables (the tables the variables that differ
        make stale are recomputed), else None (built from the log).
        """
        record = log.record()
        if record is None:
            return None
        candidates = []
        for path in sorted(flavour.parent.glob("*/*/state.json")):
            try:
                held = json.loads(path.read_text())
                src = source_from(held["source"])
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
            if not same and held.get("digest") != self.digest:
                continue
            candidates.append(
                (same, src.entries, State(src.run_id, path.parent, src, held["values"], set(held["explicit"])))
            )
        return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None

    def _build(
        self, log: EventLog, source: Source, flavour: Path, variables: dict[str, Any], base: State | None
    ) -> State:
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
                values, explicit, how = self._derive(
                    cursor, db, catalog_file, log, source, flavour, variables, base, opened
                )
            finally:
                for other in opened:
                    other.close()
                with contextlib.suppress(duckdb.Error):
                    cursor.execute("use memory")
                for name in (db, f"{db}_saved"):
                    with contextlib.suppress(duckdb.Error):
                        cursor.execute(f'detach database if exists "{name}"')
                cursor.close()
            state_json = {
                "source": source.as_json(),
                "digest": self.digest,
                "variables": variables,
                "values": values,
                "explicit": sorted(explicit),
            }
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
                with self._lock:
                    self.built[how] += 1
            found = self._read(final, source)
            if found is None:
                raise LogError(f"{final}: the derived state just written cannot be read back")
            return found
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _derive(
        self,
        cursor: duckdb.DuckDBPyConnection,
        db: str,
        catalog_file: Path,
        log: EventLog,
        source: Source,
        flavour: Path,
        variables: dict[str, Any],
        base: State | None,
        opened: list[duckdb.DuckDBPyConnection],
    ) -> tuple[dict, set, str]:
        """Fill ``catalog_file`` with the refreshed catalog of ``log`` (from ``base`` when given)."""
        if base is None:
            with self._lock:  # the instance's template of the views, made once (not by two threads at once)
                Catalog.template(self.con, self.views_dir)
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
        from engine.runs import recorded_config

        before = catalog.tail_seq()
        catalog.load(log, upto=source.tail)  # the source's events, whatever was published since
        recorded_config(catalog, log)
        if catalog.tail_seq() != source.tail:  # its parts quarantined meanwhile: read the log again
            raise _Moved
        self._flavour(catalog, variables)
        catalog.refresh()
        with self._lock:
            self.loaded[log.run_id] += catalog.tail_seq() - before
        if base is None:
            cursor.execute(f"attach '{_quoted(catalog_file)}' as \"{db}_saved\"")
            cursor.execute(f'copy from database "{db}" to "{db}_saved"')
        else:
            cursor.execute(f'checkpoint "{db}"')
        return catalog.variables.values, catalog.variables.explicit, how

    def _flavour(self, catalog: Catalog, variables: dict[str, Any]) -> None:
        """Set the flavour's variables where they differ, and reset those a base's caller set that this
        flavour does not (each makes the tables reading it stale)."""
        changed = {k: v for k, v in variables.items() if catalog.variables.values.get(k) != v}
        held = catalog.variables.values
        changed |= {k: None for k in catalog.variables.explicit - set(variables) if k in held}
        if changed:
            catalog.variables.set(**changed)

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
            states = sorted(((_mtime(p), p.parent) for p in path.glob("*/state.json")), reverse=True)
            if not states:  # nothing stored yet (another reader may be building its first state)
                continue
            if _held(states[0][1]).get("digest") != self.digest:
                shutil.rmtree(path, ignore_errors=True)
            elif path == flavour:
                for _when, old in [s for s in states if s[1] != keep.dir][1:]:
                    shutil.rmtree(old, ignore_errors=True)
            elif path.name not in mine:
                others.append((states[0][0], path))
        for _when, path in sorted(others, reverse=True)[KEPT_FLAVOURS:]:
            shutil.rmtree(path, ignore_errors=True)
        cutoff = time.time() - 3600
        for tmp in run.glob(f"*/{_TMP}*"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp, ignore_errors=True)

    def open(self, run_id: str, variables: dict[str, Any] | None = None, writable: bool = False) -> Catalog:
        """A catalog holding a run's state under ``variables`` (default: now), read from the stored state.

        Read-only (the stored file attached), or ``writable``: a copy in memory whose
        variables may be set (the tables they make stale are recomputed there, never
        in the stored state).
        """
        state = self.state(run_id, variables or NOW)
        cursor = self.con.cursor()
        with self._lock:
            self._n += 1
            db = f"open_{self._n}"
        if writable:
            cursor.execute(f"attach '{_quoted(state.catalog_file)}' as \"{db}_file\" (read_only)")
            cursor.execute(f"attach ':memory:' as \"{db}\"")
            cursor.execute(f'copy from database "{db}_file" to "{db}"')
            cursor.execute(f'detach "{db}_file"')
        else:
            cursor.execute(f"attach '{_quoted(state.catalog_file)}' as \"{db}\" (read_only)")
        cursor.execute(f'use "{db}"')
        catalog = Catalog(cursor, self.views_dir, created=True)
        catalog.variables.restore(state.values, state.explicit)
        return catalog

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
        try:
            cursor.execute(f"attach '{_quoted(state.catalog_file)}' as \"{db}\" (read_only)")
            try:
                cursor.execute(f'use "{db}"')
                for name, value in state.values.items():
                    cursor.execute(f"set variable {name} = ?", [value])
                described = cursor.execute(f"select * from {view} limit 0").description
                names = [d[0] for d in described]
                run = "" if "run_id" in names else f"'{state.run_id}' as run_id, "
                # Parquet has no 128-bit integer: a sum DuckDB types HUGEINT would come back a
                # DOUBLE (1714.0). Stored as BIGINT, it reads back the integer it is.
                cols = ", ".join(
                    f'cast("{n}" as bigint) as "{n}"' if str(t) in WIDE_INTEGERS else f'"{n}"' for n, t, *_ in described
                )
                copy = f"copy (select {run}{cols} from {view}) to '{{}}' (format parquet)"
                write_atomically(path, lambda tmp: cursor.execute(copy.format(_quoted(tmp))), f"the rows of {view}")
            finally:
                cursor.execute("use memory")
                cursor.execute(f'detach "{db}"')
            return path
        except duckdb.Error as err:
            raise LogError(f"{state.dir}: cannot derive the rows of {view} ({err})") from err
        finally:
            cursor.close()


class _Moved(Exception):
    """The log moved on while a state was built from it."""


def _held(state_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")
