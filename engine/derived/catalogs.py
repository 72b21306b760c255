"""The catalogs of stored states a process keeps open: a state's next view is derived from the catalog in hand.

Each catalog is a database of its own in the instance of :class:`engine.derived.Derived`,
its definitions copied from the instance's template (made once); two are kept whole and up
to 256 read in place (``KEPT``, ``KEPT_IN_PLACE``), the newest last, the others dropped (detached) as new ones come.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import duckdb

from engine.derived.files import Damaged, discard, write_named
from engine.derived.states import Held, States
from engine.derived.trust import cache_dir
from ingest.text import sql_text

# Catalogs of stored states kept open per process, for the rows of the next views asked: a few holding
# their events (tens of MB each), many reading them in place (views only: next to nothing held).
KEPT, KEPT_IN_PLACE = 2, 256


class Catalogs:
    """New empty catalogs in one DuckDB instance, and the ones kept open, by state directory."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, views_dir: Path, template: Callable[[duckdb.DuckDBPyConnection], None]
    ) -> None:
        """``template(cursor)``: gives the instance its template of the views (a stored one attached, or
        made and stored), before the first catalog is made."""
        self.con = con
        self.views_dir = views_dir
        self._template = template
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
            if n == 1:
                self._template(own)
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
            for in_place, most in ((False, KEPT), (True, KEPT_IN_PLACE)):
                kind = [d for d, h in self._kept.items() if h.in_place == in_place]
                dropped += [self._kept.pop(d) for d in kind[: max(0, len(kind) - most)]]
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


TEMPLATES = "_templates"  # <derived>/_templates: where the empty catalog of the views was once kept
STALE_TEMPLATE_S = 7 * 86400  # another views' template unused this long is removed


def template_dir(digest: str) -> Path:
    """Where this user keeps the empty catalog of the views ``digest`` names: their SQL is code, so it is kept
    outside every data directory (``trust.cache_dir()``), signed by this user's key like any stored file."""
    return cache_dir() / "templates" / digest[:16]


def stored_template(derived: States, cursor: duckdb.DuckDBPyConnection) -> None:
    """Give the instance its empty catalog of the views: the stored one (a DuckDB file, checked: making it
    binds every view, ~0.7 s), else made now and stored for the next process (a cache: never an error)."""
    from engine.catalog import Catalog, template_name

    name, relative = template_name(derived.views_dir), f"{TEMPLATES}/{derived.digest}"
    shutil.rmtree(derived.root / TEMPLATES, ignore_errors=True)  # where it was kept in data directories: never read
    place = template_dir(derived.digest)
    for path in sorted(place.glob("catalog-*.duckdb")):
        try:
            derived.checks.check(path, relative)
            cursor.execute(f'attach {sql_text(path)} as "{name}" (read_only)')
            with contextlib.suppress(OSError):
                os.utime(place)  # in use (see below)
            return
        except (Damaged, duckdb.Error) as why:
            derived.note(path, str(why).splitlines()[0], "dropped")
            discard(path)
        except FileNotFoundError:
            continue
    Catalog.template(cursor, derived.views_dir)

    def save(tmp: Path) -> None:
        cursor.execute(f"attach {sql_text(tmp)} as template_saved")
        try:
            cursor.execute(f'copy from database "{name}" to template_saved')
        finally:
            cursor.execute("detach template_saved")

    with contextlib.suppress(OSError, duckdb.Error):
        place.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_named(place, "catalog", relative, save, suffix=".duckdb")
        stale = time.time() - STALE_TEMPLATE_S
        for other in place.parent.iterdir():  # other views' (other checkouts or versions): kept while in use
            with contextlib.suppress(OSError):
                if other != place and other.stat().st_mtime < stale:
                    shutil.rmtree(other, ignore_errors=True)
