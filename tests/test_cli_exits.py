"""How commands end when interrupted: signals wherever they land, a reader that goes away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import click
import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import ROOT

from cli import cli
from engine.commandline import Group
from engine.process import continue_with

SIGNALS = [
    (signal.SIGINT, "Interrupted."),
    (signal.SIGTERM, "Terminated by SIGTERM."),
    (signal.SIGHUP, "Terminated by SIGHUP."),
]


@pytest.fixture(autouse=True)
def default_dispositions():
    """The dispositions of a command started from a terminal, however pytest was started
    (a signal it inherited as ignored would stay ignored, by design)."""
    saved = {s: signal.getsignal(s) for s, _ in SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def run(body) -> click.testing.Result:
    group = Group(name="t")
    group.add_command(click.Command("go", callback=body))
    return CliRunner().invoke(group, ["go"])


@pytest.mark.parametrize(("sig", "message"), SIGNALS, ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_in_python_code_exits_cleanly(sig, message):
    def body() -> None:
        os.kill(os.getpid(), sig)
        for _ in range(10**6):  # the handler runs between bytecodes
            pass
        raise AssertionError("the signal was not handled")

    before = {s: signal.getsignal(s) for s, _ in SIGNALS}
    r = run(body)
    assert r.exit_code == 128 + sig and r.stderr.strip() == message
    assert {s: signal.getsignal(s) for s, _ in SIGNALS} == before  # restored after the command


@pytest.mark.parametrize(("sig", "message"), SIGNALS, ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_inside_a_duckdb_callback_still_exits_cleanly(sig, message):
    """A scan of Arrow data runs Python code; the exception comes out as a DuckDB error."""

    def batches():
        yield pa.record_batch({"x": [0]})
        os.kill(os.getpid(), sig)
        for i in range(1, 10**5):
            yield pa.record_batch({"x": [i]})

    def body() -> None:
        reader = pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]), batches())  # noqa: F841 - read by DuckDB
        con = duckdb.connect()
        con.execute("select sum(x) from reader").fetchall()
        raise AssertionError("the signal was not handled")

    r = run(body)
    assert r.exit_code == 128 + sig and r.stderr.strip() == message, r.output
    assert "Traceback" not in r.output


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`python cli.py paths RUN | head -1`: no message (click exits 1 on EPIPE), no traceback."""
    code = """
import click
from engine.commandline import Group
group = Group(name="t")
group.add_command(click.Command("go", callback=lambda: [click.echo(f"row {i}") for i in range(10**6)]))
group(["go"])
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1 and err == "", err


def test_a_signal_the_process_was_started_ignoring_stays_ignored(tmp_path):
    """`nohup python cli.py explore ...`: logging out must not end the run. The command
    goes on until the SIGHUP was sent (a file says so), however long that takes."""
    sent = tmp_path / "sent"
    code = f"""
import time
from pathlib import Path
import click
from engine.commandline import Group
def body():
    print("started", flush=True)
    deadline = time.monotonic() + 300
    while not Path({str(sent)!r}).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("finished", flush=True)
group = Group(name="t")
group.add_command(click.Command("go", callback=body))
group(["go"])
"""
    proc = subprocess.Popen(
        ["nohup", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGHUP)
    sent.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out == b"finished\n", err


@pytest.mark.slow
@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_command_started_with_a_standard_stream_closed_still_runs(tmp_path, closed):
    """A closed fd 0/1/2 gets /dev/null: with stderr closed a run stopped as its progress
    display started, and the next file opened - a log part - would take that fd number."""
    args = [
        sys.executable,
        str(ROOT / "cli.py"),
        "--data",
        str(tmp_path / "data"),
        "explore",
        str(ROOT / "data" / "student_run" / "all_snapshots"),
        "--select",
        "--task",
        "k",
        "--num-roots",
        "2",
        "--run-id",
        "closed",
    ]
    config = tmp_path / "small.toml"
    config.write_text("[tree]\nroot_children = 1\nmax_children = 1\nmax_depth = 2\n")
    r = subprocess.run(
        [*args, "--config", str(config)],
        preexec_fn=lambda: os.close(closed),
        stdout=subprocess.DEVNULL if closed == 1 else subprocess.PIPE,
        stderr=subprocess.DEVNULL if closed == 2 else subprocess.PIPE,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    if closed != 1:
        assert b"Top-6: " in r.stdout
    replay = CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "replay", "closed"])
    assert replay.exit_code == 0 and "0 differ" in replay.stdout


def test_a_text_argument_that_is_not_utf8_is_a_usage_error(runs, tmp_path):
    """A byte that is not UTF-8 (Python keeps it as a lone surrogate) made DuckDB's binding
    raise inside `sql`, and a `--task` so named a traceback: every command refuses such a
    text argument first (a path keeps its own message where it is used)."""
    roots = ROOT / "data" / "student_run" / "all_snapshots"
    for args in (
        [b"sql", b"select '\xff'"],
        [b"replay", b"r\xff"],
        [b"paths", b"rounds", b"--tree", b"T\xff"],
        [b"select-snapshots", str(roots).encode(), str(tmp_path / "o").encode(), b"--task", b"t\xff"],
    ):
        r = subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "--data", str(runs), *args],
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            timeout=300,
        )
        err = r.stderr.decode()
        assert r.returncode == 2 and "is not UTF-8 text" in err and "Traceback" not in err, (args, err)
    assert not (tmp_path / "o").exists()
    from engine.catalog import QueryError
    from engine.collection import open_runs

    with pytest.raises(QueryError, match="the query is not UTF-8 text"):
        open_runs(runs, ["rounds"]).sql("select '\udcff'")


STUCK_CLEANUP = """
import os, threading, time
import click
from engine.commandline import Group
from engine.process import continue_with
def body():
    try:
        if os.environ.get("CONTINUE"):
            continue_with(os.environ["CONTINUE"])
        print("started", flush=True)
        threading.Event().wait(600)
    finally:  # a cleanup that never ends (a turn that does not stop)
        print("unwinding", flush=True)
        threading.Event().wait(600)
group = Group(name="t")
group.add_command(click.Command("go", callback=body))
group(["go"])
"""


def start_stuck(**env: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_CLEANUP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
    )
    assert proc.stdout.readline() == "started\n"
    return proc


def test_a_second_signal_while_unwinding_ends_the_process_with_the_first_ones_message():
    """`timeout` sends SIGTERM, then SIGINT: the second one must not cut the cleanup into a
    traceback or an exit without a message (the Teacher's processes die with the watchdog)."""
    proc = start_stuck()
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "unwinding\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and err == "Terminated by SIGTERM.\n", err


@pytest.mark.parametrize("resumable", [False, True])
def test_a_cleanup_past_its_deadline_ends_the_process(resumable):
    command = "python cli.py explore --resume r1"
    proc = start_stuck(TEACHER_MCTS_CLEANUP_DEADLINE_S="1", CONTINUE=command if resumable else "")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    note = f"; continue with: {command}" if resumable else ""
    assert err == f"the cleanup did not end in time: stopped at once{note}\nTerminated by SIGTERM.\n"


def test_an_interrupted_command_ends_with_the_command_that_continues_it():
    def body() -> None:
        continue_with("python cli.py campaign --resume c")
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**6):
            pass

    r = run(body)
    assert r.exit_code == 130 and r.stderr == "continue with: python cli.py campaign --resume c\nInterrupted.\n"
    assert run(lambda: os.kill(os.getpid(), signal.SIGINT)).stderr == "Interrupted.\n"  # not the last command's


def test_a_signal_the_kernel_hands_to_a_turns_thread_still_stops_the_engine():
    """A process-directed signal goes to any thread; Python runs the handler only in the main
    thread, when it next runs Python code. The engine waiting for turns must notice (under
    load, SIGTERM used to wait for the next finished turn: a stalled model, forever)."""
    code = """
import signal, threading
import click
from engine.commandline import Group
from engine.mcts.turns import TurnPool
from engine.teachers import TurnCancelled, TurnRequest

def runner(request, cancel):
    print("running", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # delivered to this thread
    cancel.wait()
    raise TurnCancelled("stopped")

def body():
    pool = TurnPool(None, 1, runner=runner)
    pool.submit(TurnRequest("T1", "T1/e1-1", "T1", 1, 1, 1, {}, True, "maximize"))
    try:
        pool.wait()
    finally:
        pool.close(cancel=True)
        print("closed", flush=True)

group = Group(name="t")
group.add_command(click.Command("go", callback=body))
group(["go"])
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 143 and proc.stdout == "running\nclosed\n", (proc.stdout, proc.stderr)
    assert proc.stderr == "Terminated by SIGTERM.\n"


def test_a_path_no_file_system_can_encode_is_a_usage_error(runs, tmp_path):
    """A lone high surrogate (a Python caller's string; no command line decodes to one) made
    click's path check raise UnicodeEncodeError (the fuzzing found it)."""
    for args in (["sql", "rounds", "select 1", "--parquet", "\ud800"], ["export", "rounds", "--out", "o\ud800"]):
        r = CliRunner().invoke(cli, ["--data", str(runs), *args])
        assert r.exit_code == 2 and "cannot be a path" in r.output, (args, r.output)


def test_a_path_holding_a_nul_byte_is_a_usage_error(runs):
    """A NUL byte (a Python caller's string; no command line holds one) made click's path check
    raise ValueError from os.stat (the fuzzing found it: ``explore '\\x00' rounds``)."""
    for args in (["explore", "\x00", "rounds"], ["export", "rounds", "--out", "o\x00"]):
        r = CliRunner().invoke(cli, ["--data", str(runs), *args])
        assert r.exit_code == 2 and "NUL byte" in r.output and r.exception.__class__ is SystemExit, (args, r.output)


def test_the_teacher_mcts_command_is_the_command_line_after_the_install():
    """`pip install -e .` installs `teacher-mcts` (beside the running Python in a venv)."""
    import shutil
    from pathlib import Path

    beside = Path(sys.executable).parent / "teacher-mcts"
    command = str(beside) if beside.exists() else shutil.which("teacher-mcts")
    assert command, "no teacher-mcts command: install the project (python -m pip install -e .)"
    done = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Usage: teacher-mcts" in done.stdout and "explore" in done.stdout, done.stderr
    version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=300)
    assert version.returncode == 0 and version.stdout.startswith("teacher-mcts, version "), version.stderr
