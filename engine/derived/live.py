"""A live run's derived state, kept current by its writer: as the engine publishes a part, the state that
covers it.

The engine holds the run's catalog already, refreshed for its own decisions. After it
publishes what it staged, :meth:`Keeper.published` stores that catalog's state under the
log as it is now (``now``, the flavour readers of final state use), with the rows of
the views readers of the run read from its last state, so a reader of a live run finds
the state and the rows it asks for instead of catching up what the writer has published.
A state is stored as a reader stores one (atomically, every file named by its digest),
and only when the catalog holds exactly the published log.

It is work for readers, never for the run. Between the parts a run must publish whole
(its last, a campaign's round), a state is kept only while someone reads the run (a
reader that found the run's record changed since its last read leaves
``<derived>/<run>/source.json`` newer than the writer's last state) and within
``budget`` of the writer's time (a state costs about the same each time: when one took
0.1 s, the next waits 0.5 s); so a run nobody reads pays one state at its end. Such a part's
readers never read it as the state kept before it: the writer withdraws its mark first
(:meth:`Keeper.publishing`), and a reader in between catches up from the log. A state
that cannot be stored (``derived/`` read-only or full), or took longer than ``DEADLINE``, stops the
keeping with one note (stored files are read only if regular, without blocking):
readers then derive from the log, as for a run whose writer is gone. What is recorded
never depends on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from engine.catalog import Catalog
from engine.derived.files import MAX_DOCUMENT, Damaged, Listings, discard, dump_json, load_json, read_regular
from engine.derived.keys import DERIVED, NOW, SOURCE_CACHE, Source, State, flavour_key, source_from
from engine.derived.states import Held, States
from engine.derived.store import set_flavour
from ingest.paths import file_signature, run_dir, write_atomically
from ingest.record import read_record

BUDGET = 0.2  # the share of the writer's time its states may take
KEEPER = "keeper.json"  # per run: the last state its live writer kept, and the writer's process
GRACE = 1.0  # seconds a kept state is read as of beyond the writer's next chance to keep another
MAX_LAG = 60.0  # seconds a kept state is read as of at most, whatever a mark says
DEADLINE = 30.0  # seconds a state may take to keep; one that takes longer ends the keeping


class Keeper:
    """Stores a live run's state after each part its writer publishes (within a share of the writer's time)."""

    def __init__(self, data_dir: Path | str, run_id: str, budget: float = BUDGET) -> None:
        self.data_dir = Path(data_dir)
        self.run_id = run_id
        self.budget = budget
        self.kept = 0  # states stored (tests count them)
        self.off = False
        self._states: States | None = None  # (no catalog of its own: it stores the engine's)
        self._next = 0.0
        self._since = 0  # when the last state was begun (the wall clock, as files' times)

    def published(self, catalog: Catalog, force: bool = False) -> None:
        """The writer published everything ``catalog`` holds: store its state (unless the budget says wait;
        ``force``: do not wait - the run's last part, or one a campaign reads next)."""
        if self.off or (not force and (time.monotonic() < self._next or not self._read_since())):
            return
        started, self._since = time.monotonic(), time.time_ns()
        try:
            state = self._keep(catalog)
        except Exception as err:  # never the writer's failure: readers derive from the log
            self._stop(str(err))
            return
        cost = time.monotonic() - started
        if cost > DEADLINE:  # (a stored file that blocks or a disk that stalls: not the writer's to wait on)
            self._stop(f"keeping a state took {cost:.0f} s")
            return
        self._next = started + cost / self.budget
        if state is not None:
            self.kept += 1
            # readers may read it while the log grows, until the writer could have kept a later one
            until = time.time_ns() + int(min(cost / self.budget + cost + GRACE, MAX_LAG) * 1e9)
            self._mark({"pid": os.getpid(), "source": state.source.as_json()}, until)

    def publishing(self, keep: bool) -> None:
        """The writer is about to publish a part; ``keep``: one readers must see as it is (the run's last, a
        campaign's round), so the last state kept is no longer read in its place (until its own is kept)."""
        if keep:
            self._mark(None)

    def _stop(self, why: str) -> None:
        self.off = True
        self._mark(None)
        print(
            f"note: the derived state of run {self.run_id!r} is no longer kept by its writer ({why}); "
            "readers derive it from the log",
            file=sys.stderr,
        )

    def _keep(self, catalog: Catalog) -> State | None:
        """Store the state of the log the catalog holds, unless stored already (the state; None: not stored)."""
        if self._states is None:
            self._states = States(self.data_dir)
        derived = self._states
        source = Source.of(self.data_dir, self.run_id)  # (not derived.source: its cache is the readers' sign)
        if catalog.tail_seq() != source.tail:  # something staged, or the log moved on: not this log's state
            return None
        found = derived.find(self.run_id, NOW, source)
        if found is not None:
            return found
        views = self._read_views(derived)
        set_flavour(catalog, NOW)  # (once: the engine's catalog is at "now" already, by default)
        catalog.refresh()
        held = Held(catalog)  # (the engine's: never closed here)
        held.how = "written"
        state = derived.store(held, source, NOW, views)
        if not state.dir.is_relative_to(derived.root):  # derived/ refused it: of no use to other processes
            self._stop(f"{derived.root} cannot take it")
            return None
        return state

    def _read_since(self) -> bool:
        """Whether a reader read the run's log since the last state was begun (see the module doc)."""
        try:
            return (self.data_dir / DERIVED / self.run_id / SOURCE_CACHE).stat().st_mtime_ns > self._since
        except OSError:
            return False

    def _read_views(self, derived: States) -> tuple[str, ...]:
        """The views whose rows readers wrote in the run's stored states of this flavour (what they read)."""
        place = derived.root / self.run_id / flavour_key(derived.digest, NOW)
        listed = Listings()
        views: set[str] = set()
        for directory in place.glob("*/views"):
            views |= set(listed.files(directory))
        return tuple(sorted(views))

    def _mark(self, body: dict[str, Any] | None, until: int = 0) -> None:
        """Name the last state kept in keeper.json, readable as of until ``until`` (ns of the wall clock; None:
        remove it - the keeping has ended)."""
        path = self.data_dir / DERIVED / self.run_id / KEEPER
        with contextlib.suppress(OSError):
            if body is None:
                discard(path)
                return
            write_atomically(path, dump_json(f"{self.run_id}/{KEEPER}", body | {"until": until}), durable=False)

    def close(self) -> None:
        """The run's writer is done: its last state is of its log (see the module doc), nothing is named."""
        self._mark(None)


def kept_state(derived: States, run_id: str, source: Source) -> State | None:
    """The last state a live writer kept of a run (``now``), when the run's log (``source``) has only grown
    since; None when its writer is gone, kept none, or the log changed otherwise (quarantined, replaced)."""
    try:
        held = load_json(derived.root / run_id / KEEPER, f"{run_id}/{KEEPER}")
        kept = source_from(held["source"]) if held else None
    except (Damaged, KeyError, TypeError, ValueError):
        return None
    if kept is None or kept.run_id != run_id:
        return None
    until, now = held.get("until"), time.time_ns()
    if not isinstance(until, int) or not now <= until <= now + MAX_LAG * 1e9:
        return None  # the writer published since without keeping (nobody read, or its budget): read the log
    log_dir = run_dir(derived.data_dir, run_id) / "log"
    if not _writing(held.get("pid"), log_dir.parent / "writer.lock"):  # (ended, killed, or not the writer)
        return None
    if kept == source:
        return None  # (of the log as it is now: found as any state is)
    if kept.identity != source.identity or not kept.entries or kept.tail > source.tail:
        return None
    live = {name: stat for name, *stat in source.parts}
    if any(live.get(name, stat) != stat for name, *stat in kept.parts):  # a part changed: read from the log
        return None
    try:
        record = read_record(log_dir, run_id)
    except Exception:  # a record that cannot be read now is the log's reader's to report
        return None
    if record is None or not record.extends(kept.entries, kept.last_sha):
        return None
    return derived.find(run_id, NOW, kept)


def mark_stamp(data_dir: Path, run_id: str) -> tuple | None:
    """What changes when a collection would read a live run as of another state: the writer's mark replaced
    or removed, or lapsed (None: no mark). A page that redraws on a changed record redraws on this too."""
    path = Path(data_dir) / DERIVED / run_id / KEEPER
    try:
        signature = file_signature(path)
        until = json.loads(read_regular(path, MAX_DOCUMENT)).get("until")
    except (OSError, ValueError, AttributeError, RecursionError, Damaged):
        return None
    return (*signature, not isinstance(until, int) or time.time_ns() > until)


def _writing(pid: Any, lock: Path) -> bool:
    """Whether process ``pid`` holds the run's writer lock (``lock``: its file) now, as /proc/locks says; False
    where that cannot be told (no /proc): the run is then read as its log is."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        st = lock.stat()
        held = Path("/proc/locks").read_text()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in held.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[4] == str(pid) and fields[5] == where:
            return True
    return False
