"""This process's copy of the empty catalog of each set of views, for the next catalog to start from.

Creating the views binds each one (~0.5-1 s a catalog, most of a small replay or a
sim exploration's start); attaching a DuckDB file holding them and copying it costs
~75 ms. A file is written by this process into a directory only its user can enter,
keyed by everything a catalog's definitions come from (the views' SQL and headers,
the macros, DuckDB's version), and removed when the process exits; a file that cannot
be used is dropped and the catalog built from the SQL, as without one.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

import duckdb

from engine.catalog.definitions import ViewGraph
from ingest.text import sql_text

_FILES: dict[tuple[int, str], Path] = {}  # (process, the views' digest) -> its file
_LOCK = threading.Lock()


def digest(graph: ViewGraph) -> str:
    """What a catalog's definitions come from, hashed."""
    h = hashlib.sha256(duckdb.__version__.encode())
    h.update(graph.macros_sql.encode())
    for name in graph.order:
        view = graph.views[name]
        h.update(repr((name, view.sql, view.materialized, view.summary)).encode())
    return h.hexdigest()


def connect(graph: ViewGraph, config: dict) -> duckdb.DuckDBPyConnection | None:
    """A new connection (``config``) holding this process's empty catalog of ``graph``; None when there is
    none kept, or it could not be used (then it is dropped)."""
    path = _FILES.get((os.getpid(), digest(graph)))
    if path is None:
        return None
    con = duckdb.connect(config=config)
    try:
        con.execute(f"attach {sql_text(path)} as catalog_template (read_only)")
        con.execute("copy from database catalog_template to memory")
        con.execute("detach catalog_template")
        return con
    except duckdb.Error:
        con.close()
        _FILES.pop((os.getpid(), digest(graph)), None)
        path.unlink(missing_ok=True)
        return None


def keep(con: duckdb.DuckDBPyConnection, graph: ViewGraph) -> None:
    """Keep ``con``'s database (an empty catalog of ``graph``, just made) for the next catalog of this process."""
    key = (os.getpid(), digest(graph))
    with _LOCK:
        if key in _FILES:
            return
        with contextlib.suppress(OSError, duckdb.Error):
            path = _directory() / f"catalog-{key[1][:16]}.duckdb"
            con.execute(f"attach {sql_text(path)} as catalog_kept")
            try:
                con.execute("copy from database memory to catalog_kept")
            finally:
                con.execute("detach catalog_kept")
            _FILES[key] = path


_DIRECTORY: dict[int, Path] = {}


PREFIX = "teacher-mcts-catalogs-"


def _directory() -> Path:
    """This process's directory of files (mode 0700, removed at exit; those of killed processes when made)."""
    pid = os.getpid()
    if pid not in _DIRECTORY:
        made = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-"))
        _DIRECTORY[pid] = made
        atexit.register(_remove, pid, made)
        _sweep(made.parent)
    return _DIRECTORY[pid]


def _sweep(parent: Path) -> None:
    """Remove this user's directories of processes that are gone (killed: no exit ran)."""
    for other in parent.glob(f"{PREFIX}*-*"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(other.name[len(PREFIX) :].split("-", 1)[0])
            if other.stat().st_uid == os.getuid() and not _alive(pid):
                shutil.rmtree(other, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _remove(pid: int, directory: Path) -> None:
    if os.getpid() == pid:  # not a forked child's exit
        shutil.rmtree(directory, ignore_errors=True)
