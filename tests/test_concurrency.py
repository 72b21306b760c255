"""Readers while a writer appends, a second writer, two runs at once, and a run the user cannot write.

Every wait here waits for a condition with a generous deadline (the machine may be
loaded); nothing depends on how fast it is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ENDLESS, ROOT, SNAPSHOTS, copy_run
from soundness import assert_log_is_sound, logical_log

from cli import cli
from engine.catalog import Catalog
from ingest.integrity import verify_log
from ingest.log import EventLog, run_dir

pytestmark = pytest.mark.slow
DEADLINE_S = 600.0
# Three small trees whose turns take ~0.05 s each: a run that ends.
SHORT = "[tree]\ntarget_good_leaves = 3\n[backend_options]\nlatency_s = 0.05\n"


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


def start_explore(data: Path, run_id: str, config: Path, *extra: str) -> subprocess.Popen:
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
            "k",
            "--num-roots",
            "3",
            "--run-id",
            run_id,
            "--config",
            str(config),
            "--parallel",
            "2",
            *extra,
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {DEADLINE_S:.0f} s")
        time.sleep(0.05)


def finish(proc: subprocess.Popen, stop: bool = False) -> None:
    """Wait for ``explore`` to end (with ``stop``: SIGTERM it first, it must unwind cleanly)."""
    try:
        if stop:
            assert proc.poll() is None, "the run ended on its own"
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode(errors="replace")
    if stop:
        assert proc.returncode == 143 and err.rstrip().endswith("Terminated by SIGTERM."), (proc.returncode, err)
    else:
        assert proc.returncode == 0, err[-2000:]


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_every_reader_sees_a_consistent_prefix_while_explore_writes(tmp_path):
    data = tmp_path / "data"
    proc = start_explore(data, "live", config(tmp_path, ENDLESS))
    log = EventLog(data, "live")
    seen = {"replay": [], "sql": [], "audit": [], "verify": [], "paths": []}
    try:
        wait_for(log.exists, "the run's first part")
        while len(seen["paths"]) < 3:
            r = invoke(data, "replay", "live", "--json")  # every decision of the prefix re-derived
            assert r.exit_code == 0, r.output
            seen["replay"].append(json.loads(r.stdout)["decisions"])
            r = invoke(data, "sql", "live", "select count(*) as n, max(seq) as tail from events", "--json")
            assert r.exit_code == 0, r.output
            (row,) = json.loads(r.stdout)
            assert row["n"] == row["tail"], "the events read are not a gapless prefix"
            seen["sql"].append(row["n"])
            r = invoke(data, "audit", "live", "--json")
            assert r.exit_code == 0 and json.loads(r.stdout)["violations"] == [], r.output
            seen["audit"].append(1)
            found = verify_log(log)
            assert found.ok, found.problem
            seen["verify"].append(found.intact_to)
            r = invoke(data, "paths", "live", "--json")  # a run in progress has no selection yet
            assert r.exit_code == 1 and "has no path selection yet" in r.stderr, r.output
            seen["paths"].append(r.exit_code)
    finally:
        finish(proc, stop=True)
    for name in ("replay", "sql", "verify"):  # what each saw grew as the run went on
        assert seen[name] == sorted(seen[name]) and seen[name][0] < seen[name][-1], (name, seen[name])
    r = invoke(data, "replay", "live")
    assert r.exit_code == 0 and verify_log(log).ok, r.output


def test_catalog_loads_and_verify_see_whole_prefixes_while_parts_merge(data_dir):
    """A writer appending as fast as it can (a merge every 8 appends) and the readers
    that list, check and load parts: every load is a gapless prefix, never an error."""
    code = textwrap.dedent("""
        import sys
        from ingest.log import LogWriter
        from ingest.events import RunStarted, SnapshotSeen
        w = LogWriter.create(sys.argv[1], "r")
        w.append([RunStarted(command="t")])
        for k in range(3000):
            w.append([SnapshotSeen(task="t", snapshot=str(k), path="/p", global_index=k)] * (1 + k % 3))
        w.close()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)], env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE
    )
    log = EventLog(data_dir, "r")
    loads, last, ended = 0, 0, False
    try:
        wait_for(log.exists, "the first part")
        while not ended or loads < 3:  # the last load begins after the writer has ended
            ended = proc.poll() is not None
            catalog = Catalog.for_log(log)
            n, tail = catalog.con.execute("select count(*), max(seq) from event_log").fetchone()
            assert n == tail >= last
            found = verify_log(log)
            assert found.ok and found.intact_to >= tail, found.problem
            last, loads = tail, loads + 1
    finally:
        finish(proc)
    assert last == 1 + sum(1 + k % 3 for k in range(3000))


def test_a_part_renamed_between_two_looks_is_found(tmp_path, monkeypatch):
    """A committed part moves from its temporary name to its name while a reader looks for it
    (the writer renames it right after recording it): the reader finds it under one of them,
    never at neither (which verify would report as a part missing from a sound log)."""
    from ingest.paths import TMP_MARK
    from ingest.record import locate

    name = "part-000000000001-000000000001-L0-" + "0" * 32 + ".parquet"
    (tmp_path / (TMP_MARK + name)).write_bytes(b"bytes")
    looks = []
    exists = Path.exists

    def look_then_rename(path: Path) -> bool:  # the writer's rename lands right after the first look
        found = exists(path)
        looks.append(path.name)
        if len(looks) == 1:
            os.rename(tmp_path / (TMP_MARK + name), tmp_path / name)
        return found

    monkeypatch.setattr(Path, "exists", look_then_rename)
    assert locate(tmp_path, name) is not None, looks


def test_a_second_writer_is_refused_while_a_run_is_written(tmp_path):
    data = tmp_path / "data"
    proc = start_explore(data, "live", config(tmp_path, ENDLESS))
    log = EventLog(data, "live")
    try:
        wait_for(log.exists, "the run's first part")
        before = log.tail_seq()
        for command in (
            ["explore", "--resume", "live"],
            ["reselect", "live", "--top-k", "2"],
            ["quarantine", "live", log.parts()[0].path.name],
        ):
            r = invoke(data, *command)
            assert r.exit_code == 1, (command, r.output)
            assert f"run 'live' is being written by another process (pid {proc.pid})" in r.stderr, r.output
        wait_for(lambda: log.tail_seq() > before, "the writer appending on")
    finally:
        finish(proc, stop=True)
    r = invoke(data, "replay", "live")
    assert r.exit_code == 0 and verify_log(log).ok, r.output


def test_two_runs_written_at_once_do_not_interfere(tmp_path):
    """Two runs of the same roots, config and seed in one data dir, at the same time: each
    is the log the other is (rounds mode), each replays, and both read as a collection.
    The first waits (SIGSTOP) until the second has started, so they surely overlap."""
    data = tmp_path / "data"
    short = config(tmp_path, SHORT)
    a = start_explore(data, "a", short, "--seed", "4")
    procs = [a]
    try:
        wait_for(EventLog(data, "a").exists, "run a's first part")
        a.send_signal(signal.SIGSTOP)
        procs.append(start_explore(data, "b", short, "--seed", "4"))
        wait_for(EventLog(data, "b").exists, "run b's first part")
        a.send_signal(signal.SIGCONT)
    finally:
        a.send_signal(signal.SIGCONT)
        for proc in procs:
            finish(proc)
    assert logical_log(data, "a") == logical_log(data, "b")
    for run_id in ("a", "b"):
        assert verify_log(EventLog(data, run_id)).ok
        assert invoke(data, "replay", run_id).exit_code == 0
        assert_log_is_sound(data, run_id)
    r = invoke(data, "audit", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"] == ["a", "b"], r.output


def as_user_without_write_access(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``cli.py args`` as a process that file permissions apply to.

    Root ignores them; in a user namespace of its own it is the files' owner without
    the power to override their bits.
    """
    prefix = ["unshare", "--user"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, sys.executable, str(ROOT / "cli.py"), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=DEADLINE_S,
    )


def test_a_run_the_user_cannot_write_reads_and_refuses_writes_cleanly(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    before = {p: p.read_bytes() for p in run_dir(data, "rounds").rglob("*") if p.is_file()}
    read_only = stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    for path in [run_dir(data, "rounds"), *run_dir(data, "rounds").rglob("*")]:
        path.chmod(read_only if path.is_dir() else read_only & ~stat.S_IXUSR & ~stat.S_IXGRP & ~stat.S_IXOTH)
    try:
        probe = as_user_without_write_access(["--data", str(data), "verify", "rounds"])
        assert probe.returncode == 0, probe.stderr
        for command in (
            ["replay", "rounds"],
            ["paths", "rounds"],
            ["sql", "rounds", "select count(*) from trees"],
            ["audit", "rounds"],
        ):
            r = as_user_without_write_access(["--data", str(data), *command])
            assert r.returncode == 0 and "Traceback" not in r.stderr, (command, r.stderr)
        for command in (["explore", "--resume", "rounds"], ["reselect", "rounds", "--top-k", "2"]):
            r = as_user_without_write_access(["--data", str(data), *command])
            assert r.returncode == 1 and "Traceback" not in r.stderr, (command, r.stderr)
            assert r.stderr.startswith(f"Error: {run_dir(data, 'rounds') / 'writer.lock'}: Permission denied"), r.stderr
    finally:
        for path in [run_dir(data, "rounds"), *run_dir(data, "rounds").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert {p: p.read_bytes() for p in run_dir(data, "rounds").rglob("*") if p.is_file()} == before
    shutil.rmtree(data)
