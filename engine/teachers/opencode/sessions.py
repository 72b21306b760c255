"""OpenCode's session store: pointing a recorded session at the worktree that forks it,
and carrying sessions between databases (the lanes of served turns) and stores (the
nodes of a cluster).

OpenCode binds a session to the directory it was created in: a run of it from
another directory hangs, its tools acting in the old one. Before a fork, the source
session's ``directory`` in OpenCode's own SQLite database is set to the new
worktree, so the fork and its tools run there.

A session made in another store (on another node of a cluster) is brought in from
the JSON ``opencode export`` wrote of it: ``opencode import`` run from the new
worktree binds it to that worktree (and its git project) as it upserts it.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from ingest.errors import ProjectError
from ingest.paths import write_atomically

COMMAND_TIMEOUT_S = 300  # an export or import takes 1-2 s


def move_session(database: Path, session: str, directory: Path) -> None:
    """Make ``session`` belong to ``directory`` (absolute)."""
    if not database.exists():
        raise ProjectError(f"{database}: OpenCode's database is missing (session {session})")
    # Servers busy writing their sessions can hold the database for long: wait as long as a turn may.
    with sqlite3.connect(database, timeout=300) as con:
        updated = con.execute(
            "update session set directory = ? where id = ?", (str(Path(directory).resolve()), session)
        ).rowcount
    if updated != 1:
        raise ProjectError(f"OpenCode session {session} not found in {database}")


def has_session(database: Path, session: str) -> bool:
    """Whether the store of ``database`` holds ``session``."""
    if not database.exists():
        return False
    with sqlite3.connect(database, timeout=30) as con:
        try:
            return con.execute("select count(*) from session where id = ?", (session,)).fetchone()[0] == 1
        except sqlite3.DatabaseError as err:
            if "no such table" in str(err):  # a database its server is creating now
                return False
            raise ProjectError(f"{database}: not a readable OpenCode database ({err})") from None


def export_session(binary: str, env: dict[str, str], session: str, dest: Path) -> None:
    """Write ``session`` as ``opencode export`` prints it to ``dest`` (atomically)."""

    def export(partial: Path) -> None:
        with open(partial, "wb") as out:
            done = subprocess.run(
                [binary, "export", session],
                env=env,
                cwd=dest.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.PIPE,
                timeout=COMMAND_TIMEOUT_S,
            )
        if done.returncode != 0:
            msg = done.stderr.decode(errors="replace").strip()[-300:]
            raise ProjectError(f"opencode could not export session {session}: {msg}")

    write_atomically(dest, export, durable=False)


def import_session(binary: str, env: dict[str, str], file: Path, worktree: Path) -> None:
    """Bring the session exported to ``file`` into the store of ``env``, bound to ``worktree``."""
    done = subprocess.run(
        [binary, "import", str(file)],
        env=dict(env, PWD=str(worktree)),
        cwd=worktree,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if done.returncode != 0:
        msg = done.stderr.decode(errors="replace").strip()[-300:]
        raise ProjectError(f"opencode could not import the session in {file}: {msg}")


def holding(stores, session: str):
    """The first of ``stores`` (``environment.Environment``) with a database that holds ``session``,
    on that database (None: none)."""
    for store in stores:
        for database in store.databases().values():
            if has_session(database, session):
                return store.on_database(database)
    return None


def bring_session(env, run_store, source: str, file: str | None, worktree: Path, edge_dir: Path, *, move: bool) -> None:
    """Make ``source`` a session of ``env``'s database (``environment.Environment``), importing it
    when it is not there, and (``move``) point it at ``worktree``.

    With no exported file, the session is exported from the database that holds it: another
    of the store's (a lane of served turns) or of the run's own store (``run_store``; a run
    started without a cluster). An import binds it to ``worktree`` whatever ``move`` says.
    """
    if has_session(env.database, source):
        if move:
            move_session(env.database, source, worktree)
        return
    if file is None:
        origin = holding((env, run_store), source)
        if origin is None:
            raise ProjectError(f"OpenCode session {source} is in no database of {env.home} or {run_store.home}")
        file = str(edge_dir / f"session-{source}.json")
        export_session(origin.bin, origin.env, source, Path(file))
    import_session(env.bin, env.env, Path(file), worktree)
