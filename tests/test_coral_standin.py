"""What the OpenCode backend relies on in ``coral eval`` and CORAL's grader daemon, checked on
the test stand-in and, with ``CORAL_SRC`` set, on the real CORAL (the same assertions: the
stand-in is only as good as its agreement with CORAL)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from coral_task import STAND_IN_BIN, coral_eval, daemon, git, make_student_coral, stop


@pytest.fixture(params=["stand-in", pytest.param("real", marks=pytest.mark.real_coral)])
def coral_bin(request) -> Path:
    return STAND_IN_BIN if request.param == "stand-in" else request.getfixturevalue("real_coral_bin")


@pytest.fixture
def edge(tmp_path: Path) -> tuple[Path, Path]:
    """A worktree with the breadcrumbs of a .coral whose public/ is its .opencode (the backend's layout)."""
    student = make_student_coral(tmp_path / "student")
    coral = tmp_path / "edge" / ".coral"
    coral.mkdir(parents=True)
    (coral / "config.yaml").write_bytes((student / "config.yaml").read_bytes())
    (coral / "private").symlink_to(student / "private")
    worktree = tmp_path / "edge" / "wt"
    git(student.parent / "repo", "worktree", "add", "-q", "--detach", str(worktree))
    (worktree / ".opencode" / "attempts").mkdir(parents=True)
    (coral / "public").symlink_to(worktree / ".opencode")
    (tmp_path / "edge" / "repo").symlink_to(worktree)
    exclude = Path(git(worktree, "rev-parse", "--git-common-dir"))
    (worktree / exclude / "info").mkdir(exist_ok=True)
    (worktree / exclude / "info" / "exclude").write_text("/.opencode/\n/.coral_dir\n/.coral_agent_id\n")
    return coral, worktree


def attempts(worktree: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (worktree / ".opencode" / "attempts").glob("*.json")}


def test_coral_eval_without_its_breadcrumb_is_a_traceback(coral_bin, edge):
    _, worktree = edge
    (worktree / "solution.py").write_text("VALUE = 2.0\n")
    head = git(worktree, "rev-parse", "HEAD")
    done = coral_eval(coral_bin, worktree, "no breadcrumb")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert f"FileNotFoundError: No .coral directory found from {worktree}" in done.stderr
    assert git(worktree, "rev-parse", "HEAD") == head  # nothing committed


def test_coral_eval_commits_and_waits_for_the_daemon(coral_bin, edge, tmp_path):
    coral, worktree = edge
    (worktree / ".coral_dir").write_text(str(coral))
    (worktree / ".coral_agent_id").write_text("teacher")
    seed = git(worktree, "rev-parse", "HEAD")
    # No daemon: a pending attempt, then STILL PENDING on stderr, exit 2.
    (worktree / "solution.py").write_text("VALUE = 2.0\n")
    done = coral_eval(coral_bin, worktree, "two", "--timeout", "2")
    assert done.returncode == 2 and "CORAL Eval: STILL PENDING" in done.stderr, done.stderr
    first = git(worktree, "rev-parse", "HEAD")
    assert first != seed
    assert attempts(worktree)[first] | {"timestamp": None} == {
        "commit_hash": first,
        "agent_id": "teacher",
        "title": "two",
        "score": None,
        "status": "pending",
        "parent_hash": seed,
        "timestamp": None,
        "feedback": "",
    }
    assert (worktree / ".opencode" / ".git").is_dir()  # the checkpoint repository of public/
    assert git(worktree, "status", "--porcelain") == ""  # breadcrumbs and .opencode not committed
    # One pending attempt of the agent is the limit: refused, nothing committed.
    (worktree / "solution.py").write_text("VALUE = 3.0\n")
    done = coral_eval(coral_bin, worktree, "three")
    assert done.returncode == 1 and done.stderr.startswith("Error: You already have 1 pending attempt(s)")
    assert git(worktree, "rev-parse", "HEAD") == first
    # Another agent's pending attempt, of a commit this repository lacks (as a copied shared
    # dir brings along): it limits no one else, but the daemon grades it too.
    other = "c" * 40
    (worktree / ".opencode" / "attempts" / f"{other}.json").write_text(
        json.dumps(
            {
                "commit_hash": other,
                "agent_id": "agent-2",
                "title": "theirs",
                "score": None,
                "status": "pending",
                "parent_hash": None,
                "timestamp": "2026-01-01T00:00:00+00:00",
                "feedback": "",
            }
        )
    )
    grader = daemon(coral_bin, coral, tmp_path / "daemon.log")
    try:
        deadline = time.monotonic() + 120
        while attempts(worktree)[first]["status"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.2)
        done = coral_eval(coral_bin, worktree, "three")
        (worktree / "solution.py").write_text("VALUE = CRASH\n")
        crashed = coral_eval(coral_bin, worktree, "crash")
        nothing = coral_eval(coral_bin, worktree, "again")
    finally:
        stop(grader)
    graded = attempts(worktree)
    assert (graded[other]["status"], graded[other]["score"]) == ("crashed", None)
    assert "worktree add" in graded[other]["feedback"]
    assert (graded[first]["score"], graded[first]["status"]) == (2.0, "improved")
    # Graded in submission order: the other agent's (oldest), the pending one, then these.
    assert done.returncode == 0, done.stdout + done.stderr
    second, third = git(worktree, "rev-parse", "HEAD~1"), git(worktree, "rev-parse", "HEAD")
    block = done.stdout.split("=" * 50)[1].strip().splitlines()
    # The count is the counter as the eval read it, which races with the daemon's rewrite of it.
    assert re.fullmatch(r"CORAL Eval( \(#[23]\))?: 3\.0000000000", block[0]), block
    assert block[1:3] == [f"Commit:  {second[:12]}", "Status:  improved"]
    assert (graded[second]["score"], graded[second]["status"], graded[second]["parent_hash"]) == (
        3.0,
        "improved",
        first,
    )
    assert git(worktree / ".opencode", "cat-file", "-t", graded[second]["shared_state_hash"]) == "commit"
    assert crashed.returncode == 0 and re.search(r"CORAL Eval( \(#[34]\))?: FAILED", crashed.stdout)
    assert (graded[third]["score"], graded[third]["status"]) == (None, "crashed")
    assert (worktree / ".opencode" / "eval_count").read_text().strip() == "4"
    assert (worktree / ".opencode" / "grader_daemon_heartbeat").exists()
    assert nothing.returncode == 1 and "Error: Nothing to commit — no changes detected." in nothing.stderr
    # Grading checked the commits out under private/grader_checkouts and removed them again.
    assert git(worktree, "worktree", "list").count("grader_checkouts") == 0
