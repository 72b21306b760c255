"""One turn on a server of the store (``server.Servers``): its session made or forked, its prompt, its wait.

The turn waits for ``session.idle`` (or its deadline, or a cancel), then for the answer to be
stored; a turn cut short is aborted and what it left running in its worktree killed. A server
that dies under it makes it ``gone``, naming the server (``Served.lost``), so a crash counts
once toward ``backend_error_limit`` however many turns it carried (``int_turns__failing``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.teachers.opencode.server import ServerGone, Servers
from engine.teachers.opencode.sessions import move_session
from ingest.errors import ProjectError

QUIET_S = 5.0  # a session idle this long after its prompt was stored, with no answer, ended without one


@dataclass
class Served:
    """How a served turn ended (``completed``, ``timeout``, ``startup``, ``cancelled`` or ``gone``: the server
    exited, or could not start or fork it; ``why`` says, else the session's error, if any), its session, the
    session's messages (empty when gone) and, when the server died under it, that server's ``Server.name``."""

    outcome: str
    session: str | None
    messages: list[dict[str, Any]]
    why: str | None = None
    lost: str | None = None


def run_served(
    servers: Servers,
    *,
    worktree: Path,
    source: str | None,
    title: str,
    prompt: str,
    model: str,
    cancel: threading.Event,
    timeout_s: float,
    startup_s: float | None,
    bind: Callable[[str], None],
    work_started: Callable[[], float | None] | None,
) -> Served:
    """One turn on a server of the store: a session in ``worktree`` (forked from ``source`` and moved
    there, or new), the prompt, and its wait - until the session is idle, ``cancel``, or a
    deadline as :meth:`Supervisor.run` keeps it (``timeout_s`` of work, ``startup_s`` before it).
    A turn cut short is aborted (the running tool's process group goes with it) and what it left
    running in the worktree is killed."""
    t0 = time.monotonic()
    try:
        server, lane = servers.acquire(source)
    except ProjectError as err:
        return Served("gone", None, [], str(err))
    session = None
    try:
        try:
            if source:
                servers.bring(source, lane, worktree)
                session = server.fork(source)
                move_session(lane.store.database, session, worktree)
                base = len(server.messages(session) or [])  # the conversation it forked
            else:
                session, base = server.create(worktree, title), 0
            servers.placed(session, lane)
            bind(session)
            idle = server.prompt(session, prompt, model)
        except (ServerGone, ProjectError, sqlite3.Error, subprocess.SubprocessError) as err:  # a backend failure
            return Served("gone", session, [], str(err), server.lost())
        outcome, messages, woken, quiet_since, check_at = "completed", None, False, None, 0.0
        while True:
            if idle.wait(0.1):
                idle.clear()
                woken = True
                if not server.alive():
                    why = server.stalled or f"opencode serve exited with {server.proc.returncode}"
                    return Served("gone", session, [], why, server.name)
            now = time.monotonic()
            if woken and now >= check_at:  # idle once: wait for its answer to be stored
                check_at = now + 0.2
                with contextlib.suppress(ServerGone, ProjectError):
                    state, messages = server.progress(session, base)
                    if state == "answered":
                        break
                    quiet_since = quiet_since or now if state == "quiet" else None
                    if quiet_since is not None and now - quiet_since > QUIET_S:  # ended with no answer at all
                        break
            if cancel.is_set():
                outcome = "cancelled"
                break
            begun = work_started() if work_started else t0
            if begun is None and now > t0 + (startup_s if startup_s is not None else timeout_s):
                outcome = "startup"
                break
            if begun is not None and now > begun + timeout_s:
                outcome = "timeout"
                break
        if outcome != "completed":
            server.abort(session)
            deadline = time.monotonic() + 30
            with contextlib.suppress(ServerGone):
                while server.busy(session) and time.monotonic() < deadline:
                    time.sleep(0.1)
        # Nothing the turn started outlives it (as with a process a turn): a tool left in the
        # background, or the npm install OpenCode starts in a ``.opencode/`` it finds.
        server.kill_tools(worktree)
        try:
            messages = messages if outcome == "completed" and messages is not None else server.messages(session)
        except (ServerGone, ProjectError) as err:
            return Served("gone", session, [], str(err), server.lost())
        return Served(outcome, session, messages, server.error(session))
    finally:
        if session is not None:
            server.release(session, worktree)
        servers.release(server, lane)
