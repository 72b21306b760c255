"""`watch`: consistent frames of a run being written, the end of a run, and a real terminal."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import ROOT, SNAPSHOTS, copy_run

from cli import cli
from engine.catalog import Catalog
from engine.runset import Reader
from engine.watch import follow
from ingest.columns import LIGHT_SCHEMA
from ingest.log import EventLog

MONOTONE = ("trees_done", "kept_edges", "pruned_edges", "retried_edges", "leaves", "tool_calls")


def start_explore(data: Path, run_id: str, latency: float = 0.2) -> subprocess.Popen:
    config = data.parent / f"{run_id}.toml"
    config.write_text(f"parallel = 3\n[tree]\ntarget_good_leaves = 4\n[backend_options]\nlatency_s = {latency}\n")
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(SNAPSHOTS),
            "--select",
            "--task",
            "kernel-speedup",
            "--num-roots",
            "3",
            "--run-id",
            run_id,
            "--config",
            str(config),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_log(log: EventLog, proc: subprocess.Popen, deadline: float = 120) -> None:
    end = time.monotonic() + deadline
    while not log.exists():
        assert proc.poll() is None and time.monotonic() < end, "the run did not start"
        time.sleep(0.05)


def test_a_later_load_adds_only_the_new_parts_and_equals_a_whole_load(runs, tmp_path):
    """What watch relies on: loading a grown log again adds just what was published since."""
    log = EventLog(runs, "rounds")
    events = log.read_table(LIGHT_SCHEMA.names)
    cut = events.num_rows // 2
    from ingest.log import LogWriter

    data = tmp_path / "data"
    with LogWriter.create(data, "grow") as writer:
        first = events.slice(0, cut).to_pylist()
        from ingest.schema import from_row

        writer.append([from_row(r) for r in first])
        catalog = Catalog.for_log(EventLog(data, "grow"), threads=1)
        catalog.query("select * from nodes")
        writer.append([from_row(r) for r in events.slice(cut).to_pylist()])
    catalog.load(EventLog(data, "grow"))
    whole = Catalog.for_log(EventLog(data, "grow"), threads=1)
    assert catalog.tail_seq() == whole.tail_seq() == events.num_rows
    for view in ("nodes", "edges", "trees", "turns"):
        got, want = (c.query(f"select * from {view} order by all") for c in (catalog, whole))
        assert got == want, view


@pytest.mark.slow
def test_every_frame_is_a_consistent_prefix_while_a_writer_appends(tmp_path):
    data = tmp_path / "data"
    proc = start_explore(data, "live")
    log = EventLog(data, "live")
    try:
        wait_for_log(log, proc)
        frames = list(follow(Reader(data), "live", period=0.5))
    finally:
        proc.wait(timeout=300)
    assert proc.returncode == 0 and frames[-1].finished
    assert len({f.seq for f in frames}) >= 3, "the writer published too few parts while watched"
    for before, after in zip(frames, frames[1:], strict=False):
        assert after.seq >= before.seq
        for key in MONOTONE:
            assert after.progress[key] >= before.progress[key], key
    # Each frame is exactly what the log said at its seq: the views at that prefix agree.
    whole = Catalog.for_log(log)
    for frame in frames[:: max(1, len(frames) // 5)] + [frames[-1]]:
        whole.variables.set(watermark=frame.seq)
        assert whole.query("select * from run_progress")[0] == frame.progress, frame.seq
    assert frames[-1].progress["trees_done"] == 3


def test_watch_of_a_finished_run_prints_its_final_state_and_exits_0(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    once = CliRunner().invoke(cli, ["--data", str(data), "watch", "rounds", "--once"])
    assert once.exit_code == 0, once.output
    assert once.stdout.startswith("run rounds (task kernel-speedup): finished")
    assert "trees  4: 4 done, 0 active" in once.stdout
    follow_to_end = CliRunner().invoke(cli, ["--data", str(data), "watch", "rounds"])
    assert follow_to_end.exit_code == 0 and follow_to_end.stdout.count("\n") == 1
    assert follow_to_end.stdout.startswith("rounds seq ") and "trees 4/4 done" in follow_to_end.stdout
    missing = CliRunner().invoke(cli, ["--data", str(data), "watch", "nope"])
    assert missing.exit_code == 1 and "run 'nope' not found" in missing.stderr


def capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_watch_in_a_terminal_shows_the_live_view_and_ends_with_the_run(tmp_path):
    assert shutil.which("tmux"), "tmux is needed (.ci/run installs it)"
    data = tmp_path / "data"
    proc = start_explore(data, "term", latency=0.3)
    session = f"watch-{os.getpid()}"
    done = tmp_path / "watch.rc"
    try:
        wait_for_log(EventLog(data, "term"), proc)
        # COLUMNS and LINES (pytest exports them) would make rich ignore the terminal's size.
        command = (
            f"env -u COLUMNS -u LINES {sys.executable} {ROOT / 'cli.py'} --data {data} watch term --period 0.5; "
            f"echo $? > {done}; sleep 600"
        )
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40", command], check=True)
        seen_running, screens = False, []
        deadline = time.monotonic() + 300
        while not done.exists():
            assert time.monotonic() < deadline, "watch did not end with the run"
            screens.append(capture(session))
            seen_running |= "): running |" in screens[-1] and "tree  stage" in screens[-1]
            time.sleep(0.3)
        screen = capture(session)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        proc.wait(timeout=300)
    assert seen_running, f"the live view was never seen while the run went on: {screens[-3:]}"
    assert done.read_text().strip() == "0"
    assert "term (task kernel-speedup): finished" in screen and "3 done, 0 active" in screen


def start_endless(data: Path, run_id: str, stderr: Any = subprocess.DEVNULL) -> subprocess.Popen:
    from conftest import ENDLESS

    config = data.parent / f"{run_id}.toml"
    config.write_text(ENDLESS)
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(SNAPSHOTS),
            "--select",
            "--task",
            "kernel-speedup",
            "--num-roots",
            "3",
            "--run-id",
            run_id,
            "--config",
            str(config),
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def start_watch(data: Path, run_id: str) -> subprocess.Popen:
    """`watch` on a pipe, with SIGINT as on a terminal (a background job may have started us ignoring it)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "watch", run_id, "--period", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def first_line(proc: subprocess.Popen, deadline: float = 120) -> str:
    """The first line watch prints (it is following the run from then on)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(deadline)
    assert lines and lines[0], "watch printed nothing"
    return lines[0]


@pytest.mark.slow
def test_watch_ends_when_the_writer_dies(tmp_path):
    """It showed "running" with turns in flight and a frozen ETA for good."""
    data = tmp_path / "data"
    proc = start_endless(data, "dies")
    try:
        wait_for_log(EventLog(data, "dies"), proc)
        watch = start_watch(data, "dies")
        assert first_line(watch).startswith("dies seq ")
    finally:
        proc.kill()
        proc.wait()
    try:
        _out, err = watch.communicate(timeout=300)
    finally:
        watch.kill()
    assert watch.returncode == 1, err
    assert err == (
        f"Error: run 'dies' is not finished and no process writes it any more (none holds "
        f"{data / 'runs' / 'dies' / 'writer.lock'}): its writer died - continue it with: "
        f"python {ROOT / 'cli.py'} --data {data} explore --resume dies\n"  # (watch ran as that)
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "message"), [(signal.SIGINT, 130, "Interrupted."), (signal.SIGTERM, 143, "Terminated by SIGTERM.")]
)
def test_watch_stopped_by_a_signal_exits_with_its_code(tmp_path, sig, code, message):
    """watchfiles ended its loop quietly on Ctrl-C or SIGTERM: watch exited 0, as if the run had finished."""
    data = tmp_path / "data"
    proc = start_endless(data, "sig")
    try:
        wait_for_log(EventLog(data, "sig"), proc)
        watch = start_watch(data, "sig")
        try:
            assert first_line(watch).startswith("sig seq ")
            watch.send_signal(sig)
            _out, err = watch.communicate(timeout=300)
        finally:
            watch.kill()
    finally:
        proc.kill()
        proc.wait()
    assert watch.returncode == code and err.strip().splitlines()[-1] == message, err
