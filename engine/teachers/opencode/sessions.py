"""OpenCode's session store: pointing a recorded session at the worktree that forks it.

OpenCode binds a session to the directory it was created in: a run of it from
another directory hangs, its tools acting in the old one. Before a fork, the source session's
``directory`` in OpenCode's own SQLite database is set to the new worktree, so the
fork and its tools run there.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ingest.errors import ProjectError


def move_session(database: Path, session: str, directory: Path) -> None:
    """Make ``session`` belong to ``directory`` (absolute)."""
    if not database.exists():
        raise ProjectError(f"{database}: OpenCode's database is missing (session {session})")
    with sqlite3.connect(database, timeout=30) as con:
        updated = con.execute("update session set directory = ? where id = ?",
                              (str(Path(directory).resolve()), session)).rowcount  # fmt: skip
    if updated != 1:
        raise ProjectError(f"OpenCode session {session} not found in {database}")
