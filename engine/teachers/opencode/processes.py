"""Process supervision: the OpenCode process of a turn, its deadline, and every process it started.

OpenCode's tool processes leave its process group (a bash tool call is its own
session leader), so a turn's processes are found by a marker in their
environment: ``TEACHER_MCTS_TURN`` names the turn, ``TEACHER_MCTS_RUN`` the run
(a resumed run stops what a killed process of the run left running). Companions
of a turn (CORAL's grader daemon) carry the turn's marker too, so they end with it.

A process that dies without its cleanup (``kill -9``, the OOM killer, a Ray worker
lost) cannot stop what it started, so each supervisor has a watchdog: a small
process of its own session (this file run as a script) holding the read end of a
pipe only the supervisor's process writes. When that process ends, however it
ends, the kernel closes the pipe, and the watchdog kills everything carrying the
supervisor's marker ``TEACHER_MCTS_OWNER`` (every process of its turns), then exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARKER_ENV = "TEACHER_MCTS_TURN"
RUN_ENV = "TEACHER_MCTS_RUN"  # every process of a run's turns: its run directory
OWNER_ENV = "TEACHER_MCTS_OWNER"  # every process of one supervisor's turns (its watchdog's mark)


def kill_marked(marker: str, name: str = MARKER_ENV, under: Path | None = None) -> list[int]:
    """SIGKILL every process whose environment carries ``name=marker`` (and, with ``under``, whose
    working directory is that directory or below it: what a served turn left in its worktree)."""
    needle = f"{name}={marker}".encode()
    root = str(Path(under).resolve()) if under is not None else None
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if root is not None:
                cwd = os.readlink(f"/proc/{entry}/cwd")
                if cwd != root and not cwd.startswith(root + "/"):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return killed


@dataclass(frozen=True)
class Companion:
    """A process that runs beside a turn's main process for its lifetime (a grader daemon).

    Its stdout and stderr go to ``output``; ``env`` replaces the turn's environment.
    """

    args: list[str]
    cwd: Path
    output: Path
    env: dict[str, str] | None = None


@dataclass
class Finished:
    """How a supervised process ended: ``completed`` (any exit code), ``timeout``, ``startup`` (it had
    not begun its work by the start-up limit) or ``cancelled``."""

    outcome: str
    returncode: int | None


class Supervisor:
    """Starts marked processes and makes sure none of them outlives its turn."""

    def __init__(self) -> None:
        self._markers: set[str] = set()
        self._lock = threading.Lock()
        self.owner = uuid.uuid4().hex
        self._watchdog: subprocess.Popen | None = None

    def _watch(self) -> None:
        """Start the watchdog (once) before the first process it guards."""
        with self._lock:
            if self._watchdog is None:
                self._watchdog = subprocess.Popen(
                    [sys.executable, __file__, self.owner],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )

    def guard(self) -> dict[str, str]:
        """The environment that puts a process (and what it starts) under this supervisor's
        watchdog, started now: such processes are killed when this process ends, however it ends."""
        self._watch()
        return {OWNER_ENV: self.owner}

    def adopt(self, pids: set[int]) -> None:
        """Hand these running processes to the watchdog: killed when this process ends, however it
        ends, whatever they did to their environment (Ray's agents write their title over it)."""
        self._watch()
        lines = "".join(f"{pid} {start}\n" for pid in sorted(pids) if (start := started_at(pid)) is not None)
        with self._lock:
            self._watchdog.stdin.write(lines.encode())  # type: ignore[union-attr]
            self._watchdog.stdin.flush()  # type: ignore[union-attr]

    def spawn(
        self, args: list[str], *, label: str, cwd: Path, env: dict[str, str], stderr: Path
    ) -> tuple[subprocess.Popen, str]:
        """Start a long-lived marked process (stdout piped, stderr to a file); end it with :meth:`reap`
        (:meth:`stop_all`, the watchdog and a resumed run end it too)."""
        marker = f"{label}#{uuid.uuid4().hex[:8]}"
        self._watch()
        with self._lock:
            self._markers.add(marker)
        with open(stderr, "ab") as ferr:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env, **{MARKER_ENV: marker, OWNER_ENV: self.owner}),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=ferr,
                start_new_session=True,
            )
        return proc, marker

    def reap(self, proc: subprocess.Popen, marker: str) -> None:
        """Kill a process :meth:`spawn` started and everything carrying its marker."""
        self._kill(proc, marker)
        with self._lock:
            self._markers.discard(marker)

    @contextlib.contextmanager
    def companions(self, label: str, companions: tuple[Companion, ...], env: dict[str, str]):
        """Run ``companions`` (marked) for the body's duration, then kill them and what they started."""
        marker = f"{label}#{uuid.uuid4().hex[:8]}"
        self._watch()
        with self._lock:
            self._markers.add(marker)
        started = []
        try:
            started = self._start_companions(companions, env, {MARKER_ENV: marker, OWNER_ENV: self.owner})
            yield
        finally:
            kill_marked(marker)
            for proc in started:
                proc.kill()
                proc.wait(timeout=30)
            with self._lock:
                self._markers.discard(marker)

    @staticmethod
    def _start_companions(
        companions: tuple[Companion, ...], env: dict[str, str], marks: dict[str, str]
    ) -> list[subprocess.Popen]:
        started: list[subprocess.Popen] = []
        for c in companions:
            with open(c.output, "wb") as out:
                started.append(
                    subprocess.Popen(
                        c.args,
                        cwd=c.cwd,
                        env=dict(c.env or env, **marks),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return started

    def run(
        self,
        args: list[str],
        *,
        label: str,
        cwd: Path,
        env: dict[str, str],
        stdin: Path,
        stderr: Path,
        on_line: Callable[[str], None],
        timeout_s: float,
        cancel: threading.Event,
        companions: tuple[Companion, ...] = (),
        work_started: Callable[[], float | None] | None = None,
        startup_s: float | None = None,
    ) -> Finished:
        """Run ``args`` to its end, its deadline or ``cancel``; every stdout line to ``on_line``.

        The deadline is ``timeout_s`` after the start; with ``work_started`` (when the
        process began its work, a ``time.monotonic()``, None until then), ``timeout_s``
        after that, and ``startup_s`` after the start while it has not begun (outcome
        ``startup``). ``companions`` start first and carry the same marker. On a deadline
        or cancel the process and everything carrying its marker are killed; so is
        whatever carries the marker once the process has exited (the companions).
        """
        marker = f"{label}#{uuid.uuid4().hex[:8]}"
        self._watch()
        with self._lock:
            self._markers.add(marker)
        marks = {MARKER_ENV: marker, OWNER_ENV: self.owner}
        started: list[subprocess.Popen] = []
        try:
            started += self._start_companions(companions, env, marks)
            with open(stdin, "rb") as fin, open(stderr, "wb") as ferr:
                proc = subprocess.Popen(
                    args,
                    cwd=cwd,
                    env=dict(env, **marks),
                    stdin=fin,
                    stdout=subprocess.PIPE,
                    stderr=ferr,
                    start_new_session=True,
                )
                reader = threading.Thread(target=self._read, args=(proc, on_line), daemon=True)
                reader.start()
                t0 = time.monotonic()

                def deadline() -> tuple[float, str]:
                    begun = work_started() if work_started else t0
                    if begun is None:
                        return t0 + (startup_s if startup_s is not None else timeout_s), "startup"
                    return begun + timeout_s, "timeout"

                finished = self._wait(proc, marker, deadline, cancel)
                reader.join(timeout=10)
        finally:
            kill_marked(marker)  # tool processes that outlived the turn, and the companions
            for proc in started:
                proc.kill()
                proc.wait(timeout=30)
            with self._lock:
                self._markers.discard(marker)
        return finished

    @staticmethod
    def _read(proc: subprocess.Popen, on_line: Callable[[str], None]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            on_line(raw.decode("utf-8", errors="replace"))

    def _wait(
        self, proc: subprocess.Popen, marker: str, deadline: Callable[[], tuple[float, str]], cancel: threading.Event
    ) -> Finished:
        while proc.poll() is None:
            if cancel.is_set():
                self._kill(proc, marker)
                return Finished("cancelled", proc.returncode)
            due, outcome = deadline()
            if time.monotonic() > due:
                self._kill(proc, marker)
                return Finished(outcome, proc.returncode)
            time.sleep(0.1)
        return Finished("completed", proc.returncode)

    @staticmethod
    def _kill(proc: subprocess.Popen, marker: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_marked(marker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def stop_all(self) -> None:
        """Kill every process of every turn still running, and end the watchdog."""
        with self._lock:
            markers = list(self._markers)
            watchdog, self._watchdog = self._watchdog, None
        for marker in markers:
            kill_marked(marker)
        if watchdog is not None:
            watchdog.stdin.close()  # type: ignore[union-attr]  # it kills what is left, and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(timeout=30)


def started_at(pid: int) -> str | None:
    """A process's start time (clock ticks since boot; with its pid, it names the process once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int | None = None) -> set[int]:
    """The processes that ``pid`` (default: this one) started, and theirs, running now."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def watch(owner: str) -> None:
    """The watchdog: wait for the supervisor's process to end, then kill what carries its mark
    and the processes it was handed (lines ``PID START``: see :meth:`Supervisor.adopt`).

    It ignores the signals a terminal or ``timeout`` sends (it is in a session of its
    own anyway), and kills until a pass finds nothing (a process may fork meanwhile).
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    adopted: list[tuple[int, str]] = []
    for line in sys.stdin:
        pid, _, start = line.strip().partition(" ")
        if pid.isdigit() and start:
            adopted.append((int(pid), start))
    for pid, start in adopted:
        if started_at(pid) == start:  # still that process (not a later one given its pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not kill_marked(owner, OWNER_ENV):
            return
        time.sleep(0.05)


if __name__ == "__main__":
    watch(sys.argv[1])
