"""Turns driven through long-lived ``opencode serve`` processes of the store, over their HTTP API.

A turn of ``opencode run`` starts a whole OpenCode (about 5 CPU-seconds and 500-700 MB before its first request
to the model, measured on 1.18.33). A server started once holds the store; a turn then costs a session (created,
or forked from the recorded one), a prompt, and the server's instance for the turn's worktree (2-3 CPU-seconds and
130-290 MB with its tools, disposed when the turn ends: benchmarks/teacher.py). What was measured on the pinned
version, and what this module relies on:

- ``POST /session?directory=D`` creates a session bound to ``D``; ``POST /session/S/fork`` copies
  ``S`` whole into a new session bound to ``S``'s directory, and ``S`` is left as it was. The fork's
  ``directory`` set in the store (``sessions.move_session``) before its first prompt makes it, its
  instance and its tools run in the turn's worktree;
- ``POST /session/S/prompt_async`` starts the turn; ``session.idle`` on the server's event stream
  (``/global/event``) says it ended (its answer is stored a moment later: the turn waits for it);
  ``POST /session/S/abort`` stops it, and kills the process group of a running tool;
- a turn OpenCode cannot start (a model it does not know) stores the prompt, sends ``session.error``
  with the reason, and goes idle with no answer;
- the model's requests carry ``x-session-id`` (the recorder keys a turn's exchanges by it);
- ``OPENCODE_SERVER_PASSWORD`` guards the API (basic auth, user ``opencode``): the server listens on
  loopback, and anyone who can reach it can run a shell.

Each server writes a database of its own (a lane: ``Servers`` says why, and how a turn finds its source's).

The server carries the run's and the supervisor's marks, so a resumed run and the watchdog stop it and every
tool process it started, as they stop ``opencode run``. A server that served ``recycle_turns`` turns takes no
more (Bun's heap grows with every instance it made): the next turn starts a new one, and the old one is stopped
when its last turn ends. The turns a server's loss fails name it (``served.Served.lost``): it counts once.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import secrets
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from engine.teachers.opencode.processes import MARKER_ENV, Supervisor, kill_marked
from engine.teachers.opencode.sessions import bring_session, has_session
from ingest.errors import ProjectError

LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
# The permissions ``opencode run`` gives a session it creates (a fork gets none; OPENCODE_PERMISSION
# denies the question tool, which would wait for a person, for every session).
RUN_PERMISSIONS = [{"permission": p, "pattern": "*", "action": "deny"} for p in ("question", "plan_enter", "plan_exit")]
REQUEST_TIMEOUT_S = 120.0
START_S = 120.0  # from ``opencode serve``'s start to its listening (about 2 s here)
STALL_S = 180.0  # a server with turns silent this long is killed (one spun in madvise for 20 min at 2 GB)
WATCH_S = 5.0  # how often the watchdog asks
EXIT_S = 2.0  # a server that stopped answering, given this long to finish exiting (Server.lost)


class ServerGone(Exception):
    """The server exited (or stopped answering) during a turn."""


class Server:
    """One ``opencode serve`` process (see the module docstring)."""

    def __init__(self, binary: str, env: dict[str, str], home: Path, supervisor: Supervisor) -> None:
        self.password = secrets.token_urlsafe(24)
        self.log = home / "server.log"
        self.turns = 0  # turns given to this server
        self.active = 0  # turns running on it
        self._idle: dict[str, threading.Event] = {}
        self._errors: dict[str, str] = {}  # a watched session's first session.error (e.g. an unknown model)
        self._lock = threading.Lock()
        self._stopped = False
        self.proc, self.marker = supervisor.spawn(
            [binary, "serve", "--hostname", "127.0.0.1", "--port", str(_free_port())],
            label="opencode-serve",
            cwd=home,
            env=dict(env, OPENCODE_SERVER_PASSWORD=self.password),
            stderr=self.log,
        )
        self._supervisor = supervisor
        self.name = f"{self.proc.pid}-{secrets.token_hex(3)}"  # this incarnation, named in what its loss failed
        self.url = self._listening(START_S)
        self._auth = "Basic " + base64.b64encode(f"opencode:{self.password}".encode()).decode()
        self.stalled: str | None = None  # why the watchdog killed it
        threading.Thread(target=self._events, name="opencode-events", daemon=True).start()
        threading.Thread(target=self._watch, name="opencode-watch", daemon=True).start()

    def _listening(self, start_s: float) -> str:
        """The server's address, from the line it prints once it listens."""
        found: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            with open(self.log, "ab") as log:
                for raw in self.proc.stdout:
                    log.write(raw)
                    log.flush()
                    if not found and (m := LISTENING.search(raw.decode(errors="replace"))):
                        found.append(m[1])
                        ready.set()
            ready.set()

        threading.Thread(target=read, name="opencode-serve-out", daemon=True).start()
        if not ready.wait(start_s) or not found:
            self.stop()
            tail = self.log.read_text(errors="replace")[-500:] if self.log.exists() else ""
            raise ProjectError(f"opencode serve did not start within {start_s:g} s (log {self.log}): {tail}".strip())
        return found[0]

    # -- the API

    def call(self, method: str, path: str, body: Any = None, directory: str | None = None) -> Any:
        """One request to the API; its JSON answer (None when empty)."""
        if directory is not None:
            path += "?" + urlencode({"directory": directory}, quote_via=quote)
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request(
                method,
                path,
                body=json.dumps(body).encode() if body is not None else None,
                headers={"Authorization": self._auth, "Content-Type": "application/json"},
            )
            answer = conn.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as err:
            raise ServerGone(f"opencode serve did not answer {method} {path}: {err}") from err
        finally:
            conn.close()
        if answer.status >= 400:
            raise ProjectError(f"opencode serve: {method} {path}: HTTP {answer.status}: {data[:300]!r}")
        return json.loads(data) if data.strip() else None

    def create(self, directory: Path, title: str) -> str:
        info = self.call("POST", "/session", {"title": title, "permission": RUN_PERMISSIONS}, str(directory))
        return info["id"]

    def fork(self, source: str) -> str:
        return self.call("POST", f"/session/{source}/fork", {})["id"]

    def prompt(self, session: str, text: str, model: str) -> threading.Event:
        """Start the turn; the event is set when the session is idle again."""
        provider, model_id = model.split("/", 1)
        idle = threading.Event()
        with self._lock:
            self._idle[session] = idle
        body = {"parts": [{"type": "text", "text": text}], "model": {"providerID": provider, "modelID": model_id}}
        self.call("POST", f"/session/{session}/prompt_async", body)
        return idle

    def abort(self, session: str) -> None:
        with contextlib.suppress(ServerGone, ProjectError):
            self.call("POST", f"/session/{session}/abort")

    def messages(self, session: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/session/{session}/message")

    def busy(self, session: str) -> bool:
        return session in (self.call("GET", "/session/status") or {})

    def progress(self, session: str, base: int) -> tuple[str, list[dict[str, Any]] | None]:
        """Where the turn prompted after the session's first ``base`` messages is: ``answered`` (not busy,
        its last message a finished answer to that prompt: the messages with it), ``running`` (busy, or
        the prompt not stored yet) or ``quiet`` (the prompt stored, not busy, no answer).

        ``session.idle`` can come before the answer's end is stored, and a waiter woken by a dropped
        event stream can look before the prompt is taken: a fork's last message is then the previous
        turn's answer, and the session is not busy yet."""
        if self.busy(session):
            return "running", None
        messages = self.messages(session) or []
        ours = messages[base:]
        if not any((m.get("info") or {}).get("role") == "user" for m in ours):
            return "running", None
        last = ours[-1].get("info") or {}
        done = last.get("role") == "assistant" and bool((last.get("time") or {}).get("completed") or last.get("error"))
        return ("answered", messages) if done else ("quiet", None)

    def release(self, session: str, directory: Path) -> None:
        """Forget the session's waiter and dispose of the worktree's instance (its memory)."""
        with self._lock:
            self._idle.pop(session, None)
            self._errors.pop(session, None)
        with contextlib.suppress(ServerGone, ProjectError):
            self.call("POST", "/instance/dispose", directory=str(directory))

    def _watch(self) -> None:
        """Kill the server when it carries turns and has answered nothing for ``STALL_S``."""
        answered = time.monotonic()
        while self.alive():
            if self.active == 0 or self._answers():
                answered = time.monotonic()
            elif time.monotonic() - answered > STALL_S:
                with contextlib.suppress(subprocess.TimeoutExpired):  # died, not silent: its exit is the reason
                    self.proc.wait(timeout=1.0)
                    return
                self.stalled = f"opencode serve answered nothing for {STALL_S:g} s and was killed (its log: {self.log})"
                self.stop()
                self._wake_all()
                return
            time.sleep(WATCH_S)

    def _answers(self) -> bool:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=WATCH_S)
        try:
            conn.request("GET", "/global/health", headers={"Authorization": self._auth})
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def alive(self) -> bool:
        return not self._stopped and self.proc.poll() is None

    def lost(self) -> str | None:
        """Its name when it died (given EXIT_S to finish exiting: a request can fail while it is on its way
        out), else None: a live server failed a request."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=EXIT_S)
        return None if self.alive() else self.name

    def stop(self) -> None:
        self._stopped = True
        self._supervisor.reap(self.proc, self.marker)

    def kill_tools(self, directory: Path) -> None:
        """Kill what the server started and left running in ``directory`` (a tool that left its group)."""
        kill_marked(self.marker, MARKER_ENV, under=directory)

    # -- its events

    def _events(self) -> None:
        """Follow ``/global/event``: wake a turn's waiter at its ``session.idle``, and every waiter
        when the server goes away (each then finds out why)."""
        while self.alive():
            host, port = self.url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=None)
            try:
                conn.request("GET", "/global/event", headers={"Authorization": self._auth})
                answer = conn.getresponse()
                for raw in answer:
                    if not raw.startswith(b"data:"):
                        continue
                    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                        payload = json.loads(raw[5:]).get("payload") or {}
                        if payload.get("type") == "session.idle":
                            with self._lock:
                                idle = self._idle.get(payload["properties"]["sessionID"])
                            if idle is not None:
                                idle.set()
                        elif payload.get("type") == "session.error":  # a watched session's first, kept (error())
                            found, err = payload["properties"], payload["properties"].get("error") or {}
                            text = str((err.get("data") or {}).get("message") or err.get("name") or "").strip()
                            with self._lock:
                                if found.get("sessionID") in self._idle and text:
                                    self._errors.setdefault(found["sessionID"], text.splitlines()[0][:300])
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            if self.alive():  # a dropped stream: waiters re-check the sessions themselves
                self._wake_all()
                time.sleep(0.5)
        self._wake_all()

    def error(self, session: str) -> str | None:
        """What the session's first ``session.error`` said (OpenCode's reason a turn ended unanswered), or None."""
        with self._lock:
            return self._errors.get(session)

    def _wake_all(self) -> None:
        with self._lock:
            for idle in self._idle.values():
                idle.set()


def _free_port() -> int:
    """A port nothing listens on now (``--port 0`` takes OpenCode's default, 4096, when it is free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Lane:
    """A database of the store (``environment.Environment.lane_database``) and the one server
    that writes it (None until a turn needs it, and between a recycled server and the next)."""

    index: int
    store: Any  # environment.Environment on the lane's database
    env: dict[str, str]  # the server's variables
    server: Server | None = None
    copying: threading.Lock = field(default_factory=threading.Lock)  # one copy into it at a time

    @property
    def active(self) -> int:
        return self.server.active if self.server is not None else 0


class Servers:
    """The store's servers, one a lane. Each lane has its own SQLite database: several
    servers writing one database failed statements (a turn in 64 here, ``Failed to execute
    statement``: SQLite's writers conflict across processes), and one server given 64 new
    instances at once stalled (its heap in the gigabytes, the API silent for minutes). A
    turn goes to the lane that holds its source session when that lane has room (below
    ``width`` turns), else to the lane with the fewest turns (a new one when all are full),
    where the source is copied first (``sessions.bring_session``: export and import). With
    up to ``width`` turns at once, every session is in the store's own database, as with a
    process a turn. A dead server is replaced; one that took ``recycle_turns`` turns takes no
    more and is stopped when its last turn ends (the lane then gets a new one)."""

    def __init__(
        self, store: Any, supervisor: Supervisor, width: int, recycle_turns: int, base_url: str | None = None
    ) -> None:
        self._store, self._supervisor, self._base_url = store, supervisor, base_url
        self.width = width
        self.recycle_turns = recycle_turns
        self._lanes: list[Lane] = []
        self._where: dict[str, int] = {}  # session -> lane, as far as known
        self._lock = threading.Lock()

    def _lane(self, index: int) -> Lane:
        while len(self._lanes) <= index:
            store = self._store.on_database(self._store.lane_database(len(self._lanes)))
            env = store.through(self._base_url) if self._base_url else store.env
            self._lanes.append(Lane(len(self._lanes), store, env))
        return self._lanes[index]

    def home(self, session: str) -> int | None:
        """The lane whose database holds ``session`` (None: none of the store's)."""
        if session not in self._where:
            for index, database in self._store.databases().items():
                if has_session(database, session):
                    self._where[session] = index
                    break
        return self._where.get(session)

    def acquire(self, source: str | None) -> tuple[Server, Lane]:
        with self._lock:
            for lane in self._lanes:
                if lane.server is not None and not lane.server.alive():
                    lane.server.stop()  # its turns find out and end as backend errors
                    lane.server = None
            home = self.home(source) if source else None
            open_ = [lane for lane in self._lanes if self._takes(lane.server)]
            if home is not None and self._takes(self._lane(home).server):
                lane = self._lane(home)
            elif open_:  # the serving lane with the fewest turns; one with no server when those are full
                lane = min(open_, key=lambda x: (x.server is None, x.active, x.index))
            else:
                lane = self._lane(len(self._lanes))
            if lane.server is None:
                lane.server = Server(self._store.bin, lane.env, self._store.home, self._supervisor)
            lane.server.turns += 1
            lane.server.active += 1
            return lane.server, lane

    def _takes(self, server: Server | None) -> bool:
        return server is None or (server.turns < self.recycle_turns and server.active < self.width)

    def bring(self, source: str, lane: Lane, worktree: Path) -> None:
        """Make ``source`` a session of ``lane``'s database (copied from the lane that holds it)."""
        if self.home(source) == lane.index:
            return
        with lane.copying:  # two turns can fork one source: the second finds it there
            bring_session(lane.store, self._store, source, None, worktree, worktree.parent, move=False)

    def placed(self, session: str, lane: Lane) -> None:
        with self._lock:
            self._where[session] = lane.index

    def release(self, server: Server, lane: Lane) -> None:
        with self._lock:
            server.active -= 1
            if server.active == 0 and server.turns >= self.recycle_turns and lane.server is server:
                lane.server = None
                server.stop()

    def live(self) -> list[Server]:
        with self._lock:
            return [lane.server for lane in self._lanes if lane.server is not None and lane.server.alive()]

    def parent_of(self, session: str) -> str | None:
        """The session a subagent's session was started from (None for a turn's own)."""
        for server in self.live():
            with contextlib.suppress(ServerGone, ProjectError):
                return (server.call("GET", f"/session/{session}") or {}).get("parentID")
        return None

    def stop(self) -> None:
        with self._lock:
            live = [lane.server for lane in self._lanes if lane.server is not None]
            for lane in self._lanes:
                lane.server = None
        for server in live:
            server.stop()
