"""The catalogs of stored states a process keeps open: a state's next view is derived from the catalog in hand.

Each catalog is a database of its own in the instance of :class:`engine.derived.Derived`,
its definitions copied from the instance's template (made once); a few are kept, the
newest last, the others dropped (detached) as new ones come.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from engine.catalog import Catalog

KEPT = 2  # catalogs of stored states kept open per process, for the rows of the next views asked


class Held:
    """A catalog in the instance (a database of its own), a lock for its one cursor, and how it was derived."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.lock = threading.Lock()
        self.how = ""

    def close(self) -> None:
        self.catalog.close()


class Catalogs:
    """New empty catalogs in one DuckDB instance, and the ones kept open, by state directory."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views_dir: Path) -> None:
        self.con = con
        self.views_dir = views_dir
        self._lock = threading.Lock()
        self._n = 0
        self._kept: OrderedDict[Path, Held] = OrderedDict()

    def new(self) -> Held:
        """An empty catalog of the views (the instance's template made first, once)."""
        from engine.catalog import Catalog

        with self._lock:  # (not by two threads at once)
            self._n += 1
            n = self._n
            own = self.con.cursor()  # a connection busy in one thread refuses another's statements
            Catalog.template(own, self.views_dir)
        return Held(Catalog.inside(own, f"state_{n}", self.views_dir))  # (its cursor lives on own's connection)

    def take(self, directory: Path) -> Held | None:
        """The catalog kept for a state, no longer kept (the caller's now: keep it again, or close it)."""
        with self._lock:
            return self._kept.pop(directory, None)

    def keep(self, directory: Path, held: Held) -> None:
        with self._lock:
            old = self._kept.pop(directory, None)
            self._kept[directory] = held
            dropped = [old] if old is not None and old is not held else []
            while len(self._kept) > KEPT:
                dropped.append(self._kept.popitem(last=False)[1])
        for other in dropped:
            other.close()

    def forget(self, directory: Path) -> None:
        held = self.take(directory)
        if held is not None:
            held.close()

    def close(self) -> None:
        with self._lock:
            held, self._kept = list(self._kept.values()), OrderedDict()
        for h in held:
            h.close()
