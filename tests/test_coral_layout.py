"""The CORAL layout of the OpenCode backend without a Teacher: --coral-dir checks, which Python
runs CORAL's daemon, and what a turn's layout holds aside and cleans up."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from coral_task import STAND_IN_BIN, git, make_student_coral

from cli import cli
from engine.teachers.opencode import resolve_options
from engine.teachers.opencode.coral import CoralLayout, check_daemon, coral_python
from engine.teachers.opencode.worktrees import copy_dir
from ingest.errors import InputError


def explore_with(tmp_path: Path, coral_dir: Path) -> object:
    return CliRunner().invoke(
        cli,
        [
            "--data",
            str(tmp_path / "data"),
            "explore",
            str(ROOT / "data" / "student_run" / "all_snapshots"),
            "--select",
            "--task",
            "t",
            "--backend",
            "opencode",
            "--model",
            "fake/m",
            "--coral-dir",
            str(coral_dir),
        ],
    )


def test_a_coral_dir_that_is_not_a_student_run_is_refused_before_the_run_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{STAND_IN_BIN}{os.pathsep}{os.environ['PATH']}")
    r = explore_with(tmp_path, tmp_path / "nowhere")
    assert r.exit_code == 1 and r.stderr == f"Error: --coral-dir {tmp_path / 'nowhere'}: no such directory\n"
    half = tmp_path / "half" / ".coral"
    half.mkdir(parents=True)
    (half / "config.yaml").write_text("grader:\n  direction: maximize\n")
    r = explore_with(tmp_path, half.parent)
    assert r.exit_code == 1
    assert r.stderr == f"Error: --coral-dir {half}: not a CORAL run's .coral directory (no private/)\n"
    assert not (tmp_path / "data" / "runs").exists()


def test_the_coral_dir_is_recorded_absolute_with_the_python_of_its_daemon(tmp_path, monkeypatch):
    coral = make_student_coral(tmp_path / "student")
    monkeypatch.setenv("PATH", f"{STAND_IN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    opts = resolve_options({"model": "a/b", "coral_dir": "student"})  # the run dir: its .coral is meant
    assert opts["coral_dir"] == str(coral.resolve())
    assert opts["coral_python"] == str(STAND_IN_BIN / "coral-python")  # from `coral`'s first line
    monkeypatch.setenv("PATH", os.defpath)
    with pytest.raises(InputError, match="'coral' is not on PATH"):
        resolve_options({"model": "a/b", "coral_dir": str(coral)})


@pytest.mark.parametrize(
    "first_lines, expected",
    [
        (f"#!{sys.executable}\n", sys.executable),
        ("#!/usr/bin/env python3\n", "python3"),
        ("#!/usr/bin/env -S python3 -u\n", "python3"),
        (f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\n", sys.executable),  # pip, long paths
    ],
)
def test_the_python_of_a_console_script(tmp_path, first_lines, expected):
    script = tmp_path / "coral"
    script.write_text(first_lines + "import sys\n")
    script.chmod(0o755)
    assert coral_python(f"{script} eval -m", None) == str(Path(shutil.which(expected)).absolute())


def test_a_coral_whose_python_cannot_run_the_daemon_is_refused(tmp_path):
    script = tmp_path / "coral"
    script.write_text("echo not python\n")
    with pytest.raises(InputError, match="set backend_options.coral_python"):
        coral_python(f"{script} eval -m", None)
    with pytest.raises(InputError, match=r"cannot import CORAL's grader daemon \(coral.grader.daemon: "):
        check_daemon(sys.executable, dict(os.environ))  # this project's Python has no CORAL


def test_a_turn_s_layout_holds_pending_attempts_aside_and_cleans_up(tmp_path):
    student = make_student_coral(tmp_path / "student")
    before = {p: p.read_bytes() for p in student.rglob("*") if p.is_file()}
    layout = CoralLayout(student, tmp_path / "run", str(STAND_IN_BIN / "coral-python"), "teacher")
    edge = tmp_path / "edge"
    worktree = edge / "wt"
    git(student.parent / "repo", "worktree", "add", "-q", "--detach", str(worktree))
    shared = worktree / ".opencode"
    (shared / "attempts").mkdir(parents=True)
    pending = {"commit_hash": "c" * 40, "agent_id": "agent-2", "score": None, "status": "pending"}
    graded = {"commit_hash": "e" * 40, "agent_id": "agent-2", "score": 1.0, "status": "improved"}
    for attempt in (pending, graded):
        (shared / "attempts" / f"{attempt['commit_hash']}.json").write_text(json.dumps(attempt))
    coral = layout.prepare(edge, worktree, shared, 1)
    assert (coral / "public").resolve() == shared.resolve() and (edge / "repo").resolve() == worktree.resolve()
    assert (worktree / ".coral_dir").read_text() == str(coral)
    assert (worktree / ".coral_agent_id").read_text() == "teacher"
    assert (coral / "config.yaml").read_bytes() == (student / "config.yaml").read_bytes()
    assert (coral / "private" / "eval").resolve() == tmp_path / "run" / "coral" / "private" / "eval"
    assert sorted(p.name for p in (shared / "attempts").iterdir()) == [f"{'e' * 40}.json"]  # the pending one held
    # What a killed daemon leaves: its heartbeat, a half-written attempt, a checkout.
    (shared / "grader_daemon_heartbeat").write_text("0")
    (shared / "attempts" / f".{'f' * 40}.x.json.tmp").write_text("{")
    git(worktree, "worktree", "add", "-q", "--detach", str(coral / "private" / "grader_checkouts" / "x"))
    layout.finish(edge, worktree, shared, 1)
    assert sorted(p.name for p in (shared / "attempts").iterdir()) == [f"{'c' * 40}.json", f"{'e' * 40}.json"]
    assert json.loads((shared / "attempts" / f"{'c' * 40}.json").read_text()) == pending
    # The state the turn passes on: its shared dir without the daemon's leftovers or
    # CORAL's other runtime files (a root selected before they were left out holds them).
    for name in ("manager.pid", "agent_pids.json", "logs/agent-1.log", "heartbeat/agent-1.json"):
        (shared / name).parent.mkdir(exist_ok=True)
        (shared / name).write_text("{}")
    copy_dir(shared, edge / "shared-t1")
    kept = sorted(str(p.relative_to(edge / "shared-t1")) for p in (edge / "shared-t1").rglob("*"))
    assert kept == ["attempts", f"attempts/{'c' * 40}.json", f"attempts/{'e' * 40}.json"]
    assert list((coral / "private" / "grader_checkouts").iterdir()) == []
    assert "grader_checkouts" not in git(worktree, "worktree", "list")
    assert {p: p.read_bytes() for p in student.rglob("*") if p.is_file()} == before
