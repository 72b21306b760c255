"""One file of a view's rows for every run of a still collection (issue 34).

A query over every run reads a view's rows from a file per run (``<run>/…/views/``): at
100 runs a query opens 100 files, 20-30 ms however few rows it reads. When none of a
view's per-run files changed for ``STILL_SECONDS`` (the runs are still), their rows are
copied into one file, read instead: ``<derived>/_collection/<view>/<key>/<view>-<digest>.parquet``.
Only views whose files are small (``SMALL_FILE``): their queries' time is the opening.
``key`` is the digest of the per-run files' paths in run order, and each name carries
the digest of its file's bytes, so a file is found only for exactly the rows it was
made from; a run that grew, was added or left out names other files, hence another key.
It is checked like every stored file (its bytes against its name's digest, bound to its
place) and, damaged, dropped with a note and made again. A live collection (some run's
files new) reads the per-run files: making the file at every change would double the
cost of the reads it exists to cut. A query of some runs reads their own files. Nothing
recorded or exported reads it. A cache: a write refused leaves the per-run files read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path

import duckdb

from engine.derived.files import Damaged, discard, sweep_tmp, write_named
from engine.derived.states import States
from ingest.text import sql_text

COMBINED = "_collection"  # <derived>/_collection/<view>/<key>/
STILL_SECONDS = 60.0  # a view's per-run files all older than this: its runs are still
# The newest files a view keeps: collections of other runs (every run, a campaign's, those named)
# each keep theirs rather than replacing each other's at every read; a reader of one replaced may
# still be reading it.
KEPT = 8
# A view whose per-run files average more than this is read from them: its queries spend their
# time reading rows, not opening files, and a copy would double what derived/ holds of it (the
# events' rows: ~0.75 MB a run of 100k events).
SMALL_FILE = 256 * 1024


def combined_dirs(derived: States) -> list[Path]:
    """Where collection files may lie in this process (a query connection must be allowed to read them)."""
    return [root / COMBINED for root in derived.roots.candidates]


def combined_file(derived: States, con: duckdb.DuckDBPyConnection, view: str, files: list[str]) -> str | None:
    """The checked file of ``view``'s rows in the per-run ``files`` (run order, each checked already), made
    now (by a cursor of ``con``, whose instance may write where collection files lie) when the runs are still
    and the files small; None otherwise (read the per-run files)."""
    key = hashlib.sha256("\n".join(files).encode()).hexdigest()[:32]
    relative = f"{COMBINED}/{view}/{key}"
    for root in derived.roots.all:
        for path in sorted((root / relative).glob(f"{view}-*.parquet")):
            try:
                derived.checks.check(path, relative)
                return str(path)
            except FileNotFoundError:
                continue
            except Damaged as why:
                derived.note(path, str(why), "dropped")
                discard(path)
    if not _worth_it(files):
        return None
    directory = derived.roots.writable / relative
    listed = "[" + ", ".join(sql_text(f) for f in files) + "]"
    copy = f"copy (select * from read_parquet({listed})) to {{}} (format parquet, compression zstd)"
    cursor = con.cursor()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = write_named(directory, view, relative, lambda tmp: cursor.execute(copy.format(sql_text(tmp))))
    except (OSError, duckdb.Error):  # (a full or read-only derived/: the per-run files serve)
        return None
    finally:
        cursor.close()
    try:
        derived.checks.check(path, relative)
    except (Damaged, FileNotFoundError):  # (not what was just written: the per-run files serve)
        return None
    _keep_newest(directory.parent)
    sweep_tmp(directory.parent)
    return str(path)


def _worth_it(files: list[str]) -> bool:
    """Whether the runs are still and their files small (a query of them spends its time opening them)."""
    now, sizes = time.time(), []
    try:
        for f in files:
            st = os.stat(f)
            if now - st.st_mtime < STILL_SECONDS:
                return False
            sizes.append(st.st_size)
    except FileNotFoundError:
        return False
    return sum(sizes) <= SMALL_FILE * len(sizes)


def _keep_newest(view_dir: Path) -> None:
    """Remove all but the newest KEPT files of a view (those of runs as they were)."""
    keys = []
    for d in view_dir.iterdir():
        with contextlib.suppress(FileNotFoundError):
            keys.append((d.stat().st_mtime, d))
    for _mtime, d in sorted(keys, reverse=True)[KEPT:]:
        shutil.rmtree(d, ignore_errors=True)
