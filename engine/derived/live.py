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
0.1 s, the next waits 0.5 s); so a run nobody reads pays one state at its end. A state
that cannot be stored (``derived/`` read-only or full) stops the keeping with one note:
readers then derive from the log, as for a run whose writer is gone. What is recorded
never depends on it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.derived.files import Listings
from engine.derived.keys import DERIVED, NOW, SOURCE_CACHE, Source, flavour_key

if TYPE_CHECKING:
    from engine.catalog import Catalog
    from engine.derived import Derived

BUDGET = 0.2  # the share of the writer's time its states may take


class Keeper:
    """Stores a live run's state after each part its writer publishes (within a share of the writer's time)."""

    def __init__(self, data_dir: Path | str, run_id: str, budget: float = BUDGET) -> None:
        self.data_dir = Path(data_dir)
        self.run_id = run_id
        self.budget = budget
        self.kept = 0  # states stored (tests count them)
        self.off = False
        self._derived: Derived | None = None
        self._next = 0.0
        self._since = 0  # when the last state was begun (the wall clock, as files' times)

    def published(self, catalog: Catalog, force: bool = False) -> None:
        """The writer published everything ``catalog`` holds: store its state (unless the budget says wait;
        ``force``: do not wait - the run's last part, or one a campaign reads next)."""
        if self.off or (not force and (time.monotonic() < self._next or not self._read_since())):
            return
        started, self._since = time.monotonic(), time.time_ns()
        try:
            self._keep(catalog)
        except Exception as err:  # never the writer's failure: readers derive from the log
            self.off = True
            print(
                f"note: the derived state of run {self.run_id!r} is no longer kept by its writer ({err}); "
                "readers derive it from the log",
                file=sys.stderr,
            )
        self._next = time.monotonic() + (time.monotonic() - started) / self.budget

    def _keep(self, catalog: Catalog) -> None:
        from engine.derived import Derived
        from engine.derived.catalogs import Held
        from engine.derived.store import set_flavour

        if self._derived is None:
            self._derived = Derived(self.data_dir)
        derived = self._derived
        source = Source.of(self.data_dir, self.run_id)  # (not derived.source: its cache is the readers' sign)
        if catalog.tail_seq() != source.tail:  # something staged, or the log moved on: not this log's state
            return
        if derived.find(self.run_id, NOW, source) is not None:
            return
        views = self._read_views(derived)
        set_flavour(catalog, NOW)  # (once: the engine's catalog is at "now" already, by default)
        catalog.refresh()
        held = Held(catalog)  # (the engine's: never closed here)
        held.how = "written"
        state = derived._store(held, source, NOW, views)  # noqa: SLF001 - the package's own writing of a state
        if not state.dir.is_relative_to(derived.root):  # derived/ refused it: of no use to other processes
            self.off = True
            return
        self.kept += 1

    def _read_since(self) -> bool:
        """Whether a reader read the run's log since the last state was begun (see the module doc)."""
        try:
            return (self.data_dir / DERIVED / self.run_id / SOURCE_CACHE).stat().st_mtime_ns > self._since
        except OSError:
            return False

    def _read_views(self, derived: Derived) -> tuple[str, ...]:
        """The views whose rows readers wrote in the run's stored states of this flavour (what they read)."""
        place = derived.root / self.run_id / flavour_key(derived.digest, NOW)
        listed = Listings()
        views: set[str] = set()
        for directory in place.glob("*/views"):
            views |= set(listed.files(directory))
        return tuple(sorted(views))

    def close(self) -> None:
        if self._derived is not None:
            self._derived.close()
