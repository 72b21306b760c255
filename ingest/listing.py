"""Which runs a data directory holds, and where each committed part of a run's log is found.

Light on purpose (no Arrow, no pydantic): a warm read of derived state lists the runs
and their parts with these alone, opening no part.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ingest.errors import LogError
from ingest.parts import Part
from ingest.paths import RUN_ID_RE, run_dir
from ingest.record import RECORD, Record, list_parts, locate, read_record

T = TypeVar("T")
MOVES = 50  # reads of a log a writer moved meanwhile before giving up: a merge renames and removes parts within
# milliseconds, so 50 reads in a row (~2.5 s with the backoff: a loaded machine stretches
# a merge) that each met one meet a log that stays inconsistent


class Moved(Exception):
    """A read met the log moving (a part it listed renamed or merged away, a state replaced): read again."""


def while_moving(where: Path | str, read: Callable[[], T], hint: str, last: Callable[[], T] | None = None) -> T:
    """``read()``, again from a new listing while it raises Moved or FileNotFoundError: at most MOVES times, a
    little longer apart each time; then LogError naming ``where`` (the log's directory), the last problem and ``hint``.
    ``last``: the final read instead of ``read`` (one that takes a file still missing for damage)."""
    problem = ""
    for attempt in range(MOVES):
        try:
            return (last if last is not None and attempt == MOVES - 1 else read)()
        except (Moved, FileNotFoundError) as err:
            problem = str(err) if isinstance(err, Moved) else f"{Path(err.filename or '?').name} vanished while read"
        time.sleep(0.002 * attempt)
    raise LogError(f"{where}: {problem or 'it moved'} - {hint}")


def being_written(run_directory: Path) -> bool:
    """Whether a process holds the run's writer lock (``ingest.writer.WriterLock``: ``flock`` on ``writer.lock``).

    Tested by taking a shared lock on a descriptor of our own without waiting, and
    releasing it at once: the writer's exclusive lock refuses it. (A writer starting
    in those microseconds would find the run locked and say so, and can be started
    again; the lock dies with its process, so a killed writer is seen at once.) The
    file is opened without following a link or blocking: a directory is data.
    """
    try:
        fd = os.open(run_directory / "writer.lock", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # none (never written by a writer of this version), or not a file a writer made
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (closing the descriptor releases a lock it took)
    return False


def has_log(log_dir: Path, run_id: str) -> bool:
    """Whether a run's log has at least one published event (or a record, damaged or not)."""
    if (log_dir / RECORD).exists():
        try:
            record = read_record(log_dir, run_id)
        except LogError:
            return True  # a damaged run is still a run: readers name its damage
        return bool(record and record.live)
    return bool(list_parts(log_dir))


def run_ids(data_dir: Path | str) -> list[str]:
    """The runs under ``<data>/runs`` that hold a log (a record, or parts written before records), by id."""
    try:
        names = sorted(os.listdir(Path(data_dir) / "runs"))
    except FileNotFoundError:
        return []
    return [n for n in names if RUN_ID_RE.match(n) and ".." not in n and has_log(run_dir(data_dir, n) / "log", n)]


def located(record: Record) -> tuple[list[Part], str | None]:
    """The record's live parts at the paths they are found under, or what is missing."""
    out = []
    for part in record.parts():
        path = locate(record.log_dir, part.name)
        if path is None:
            return out, f"{part.name} ({part.seqs}) is named by the run's record but is not in {record.log_dir}"
        out.append(Part(part.first, part.last, part.level, path, part.digest))
    return out, None
