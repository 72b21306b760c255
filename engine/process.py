"""The process a command runs in: signals turned into an unwinding, standard streams, the end.

A command runs with SIGINT, SIGTERM and SIGHUP raised as exceptions in the main thread
(``unwind_on_signals``), so that the cleanup on the way out runs; it ends with the first
signal's message and exit code 128 + its number (``exit_signalled``). ``run_to_exit``
runs the command line and ends the process without the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

import click

from ingest import steps
from ingest.paths import set_program

# How long the unwinding after a signal may take (stopping the turns in flight, releasing
# the log) before the process ends at once; a test sets it low through the environment.
CLEANUP_DEADLINE_S = float(os.environ.get("TEACHER_MCTS_CLEANUP_DEADLINE_S") or 120)


# The command line that continues what the running command started (``continue_with``),
# printed when it is interrupted: the hint it printed first has long scrolled away.
_CONTINUE: list[str] = []


def continue_with(command: str) -> None:
    """Name the command line that continues this command's work if it is interrupted."""
    _CONTINUE[:] = [command]


def _continue_note() -> str:
    return f"continue with: {_CONTINUE[0]}" if _CONTINUE else ""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C (args: the signal number)."""


@contextlib.contextmanager
def unwind_on_signals(received: list[int]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into an exception while a command runs.

    By default SIGTERM and SIGHUP end the process on the spot, so the cleanup on
    the way out never ran: the OpenCode sessions of the turns in flight (in process
    groups of their own) kept running with nobody to stop them. Raised in the main
    thread, the exception unwinds: the Teacher's processes are stopped, staged
    events are dropped (their turns are re-run by --resume), the lock is released.
    The unwinding has CLEANUP_DEADLINE_S, and a second signal ends it: either way the
    process ends at once with the first signal's message (``exit_now``). The
    signals received are appended to ``received``: raised inside a callback
    from DuckDB (a scan of an Arrow table runs Python code), the exception comes out
    as a DuckDB error, and the caller must still report the signal.
    """
    _CONTINUE.clear()  # (a command run in-process after another: not the other's)
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    deadline: list[threading.Timer] = []  # the unwinding's, once a signal arrived

    def handler(signum: int, frame: object) -> None:
        if received:  # a second signal while unwinding: stop now (the watchdog kills what is left)
            exit_now(received[0])
        if steps.defer(lambda: handler(signum, frame)):  # a step of the log completes first
            return
        received.append(signum)
        deadline.append(threading.Timer(CLEANUP_DEADLINE_S, exit_now, [signum, "the cleanup did not end in time"]))
        deadline[0].daemon = True
        deadline[0].start()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    # A signal the process was started ignoring stays ignored (nohup: SIGHUP; a
    # background job of a non-interactive shell: SIGINT).
    handled = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, handler) for s in handled}
    try:
        yield
    finally:  # the command has unwound: what is left is reporting the signal
        for timer in deadline:
            timer.cancel()
        for s, old in previous.items():
            signal.signal(s, old)


def signal_message(signum: int) -> str:
    return "Interrupted." if signum == signal.SIGINT else f"Terminated by {signal.Signals(signum).name}."


def exit_now(signum: int, why: str | None = None) -> None:
    """End the process at once, with the message of the first signal (from any thread).

    A Teacher's processes do not outlive it: its supervisor's watchdog kills them when
    this process is gone. Staged events are not published (--resume runs their turns again).
    """
    note = "; ".join(n for n in (f"{why}: stopped at once" if why else "", _continue_note()) if n)
    lines = [note, signal_message(signum)] if note else [signal_message(signum)]
    os.write(2, "".join(line + "\n" for line in lines).encode())
    os._exit(128 + signum)


def exit_signalled(signum: int) -> None:
    if note := _continue_note():
        click.echo(note, err=True)
    click.echo(signal_message(signum), err=True)
    sys.exit(128 + signum)


def open_standard_streams() -> None:
    """Give a closed stdin, stdout or stderr /dev/null before anything else runs.

    Started with fd 2 closed (as some launchers do), Python sets sys.stderr to None
    and a run stopped as its progress display started; and the next file opened - a
    log part - would take a closed number, where a library's or a Teacher process's
    output would land.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:  # Python found the fd closed at start-up
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


def run_to_exit(command: Callable[[], object]) -> NoReturn:
    """Run the command line, then end the process without tearing the interpreter down.

    A thread of pyarrow's pool can still be finishing a task when the command
    returns: dropping the task's last reference to a Python buffer needs the GIL,
    and a thread that asks for it while the interpreter finalizes is ended by
    Python 3.11 with ``pthread_exit``, which C++ turns into ``std::terminate``
    ("terminate called without an active exception", exit 134 after ``verify``
    had printed its result: 1 run in 5 to 40 on a loaded machine). So the process
    ends as Python's exit does - threads joined, atexit handlers run, output
    flushed - and then at once, without the teardown such a thread can trip over.
    """
    open_standard_streams()
    set_program(sys.argv[0])  # hints printed begin as this command did
    try:
        command()
        code: int = 0
    except SystemExit as done:
        code = exit_status(done.code)
    threading._shutdown()  # type: ignore[attr-defined] # what Python's exit does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (click has said so): quiet
            stream.flush()
    os._exit(code)


def exit_status(code: object) -> int:
    """The exit status of ``sys.exit(code)``, its message printed as Python would."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
