"""Where runs live: the data directory, run ids and each run's directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ingest.errors import InputError

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DATA_ENV = "TEACHER_MCTS_DATA"


def default_data_dir() -> Path:
    """The data directory: ``$TEACHER_MCTS_DATA`` or ``./data``."""
    return Path(os.environ.get(DATA_ENV) or "data")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is usable as a directory name, else raise InputError."""
    if not RUN_ID_RE.match(run_id or "") or ".." in run_id:
        msg = f"invalid run id {run_id!r}: use letters, digits, '_', '-' and '.' (max 128)"
        raise InputError(msg)
    return run_id


def run_dir(data_dir: Path, run_id: str) -> Path:
    """The directory of one run."""
    return Path(data_dir) / "runs" / check_run_id(run_id)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
