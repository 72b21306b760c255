"""The grader is checked before the budget is spent, and a grader that cannot grade stops the run.

Real ``opencode`` runs against the scripted model server, graded by the CORAL stand-in
(tests/fixtures/coral_standin) through ``--coral-dir``. The wrong ``--coral-dir`` is
the Student run of another task: its grader scores ``kernel.cu``, which this task's
code has not, so it crashes on every commit (the finding this guards against: every
eval crashed, nothing selected, exit 0).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_snapshot
from coral_task import OTHER_GRADER, make_student_coral
from fake_model import FakeModel
from test_opencode_e2e import marked_processes, opencode_process, script

from cli import cli
from engine.catalog import Catalog
from ingest.events import RunStopped
from ingest.log import EventLog, LogWriter


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    """One root whose code the Student run's grader scored 1.0."""
    folder = make_snapshot(tmp_path / "roots", 1, score=1.0)
    (folder / "code" / "solution.py").write_text("VALUE = 1.0\n")
    return tmp_path / "roots"


def explore(
    tmp_path: Path, roots: Path, student: Path, run_id: str, model: FakeModel, config: str, *extra: str
) -> subprocess.CompletedProcess:
    toml = tmp_path / f"{run_id}.toml"
    toml.write_text(config)
    args = [
        "--data",
        str(tmp_path / "data"),
        "explore",
        str(roots),
        "--task",
        "speedup",
        "--run-id",
        run_id,
        "--coral-dir",
        str(student),
        *extra,
    ]
    return opencode_process(args, tmp_path, model, toml)


def catalog(tmp_path: Path, run_id: str) -> Catalog:
    return Catalog.for_log(EventLog(tmp_path / "data", run_id))


def count(cat: Catalog, view: str) -> int:
    return cat.query(f"select count(*) as n from {view}")[0]["n"]


def replay(tmp_path: Path, run_id: str) -> object:
    return CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "replay", run_id])


def check_left_nothing(tmp_path: Path, run_id: str) -> None:
    run_dir = EventLog(tmp_path / "data", run_id).dir
    assert marked_processes(run_dir) == [], "the grader daemon outlived the check"
    assert not (run_dir / "worktrees" / "T001" / "grader-check").exists()
    branches = subprocess.run(
        ["git", "worktree", "list"],
        cwd=run_dir / "worktrees" / "T001" / "repo",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "grader" not in branches, branches


@pytest.mark.slow
def test_another_task_s_coral_dir_stops_the_run_before_any_turn(tmp_path, roots):
    other = make_student_coral(tmp_path / "other-task", grader=OTHER_GRADER)
    model = FakeModel(script).start()
    try:
        done = explore(tmp_path, roots, other, "wrong", model, "parallel = 2\n")
    finally:
        model.stop()
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" not in done.stderr.split("The grader printed:")[0]
    assert (
        "Error: the grader check before the first turn failed: the grader gave no score for the root "
        "T001 (crashed): [Errno 2] No such file or directory"
    ) in done.stderr, done.stderr
    assert "kernel.cu" in done.stderr and "Grader crashed on" in done.stderr  # what the grader printed
    assert "--no-grader-check" in done.stderr
    assert [q for q in model.requests if q["tools"]] == [], "a turn ran"
    cat = catalog(tmp_path, "wrong")
    assert count(cat, "stg_turn_finished") == 0 and count(cat, "stg_edge_started") == 0
    checks = cat.query("select tree_id, score, recorded_score, eval_status, outcome from int_grader_checks")
    assert checks == [
        {"tree_id": "T001", "score": None, "recorded_score": 1.0, "eval_status": "crashed", "outcome": "no score"}
    ]
    stops = cat.query("select reason, error from stg_run_stopped")
    assert [s["reason"] for s in stops] == ["grader_check"] and "kernel.cu" in stops[0]["error"]
    events = EventLog(tmp_path / "data", "wrong").read_table().to_pylist()
    graded = [e for e in events if e["kind"] == "grader_checked"]
    assert "FileNotFoundError" in graded[0]["grader_log"] and "kernel.cu" in graded[0]["feedback"]
    check_left_nothing(tmp_path, "wrong")
    r = replay(tmp_path, "wrong")
    assert r.exit_code == 0 and "0 differ" in r.stdout, r.output


@pytest.mark.slow
def test_a_score_off_by_more_than_the_tolerance_stops_the_run(tmp_path, roots):
    """The Student run recorded 1.0 for the root; its grader gives 1.2 here (a grader that changed)."""
    student = make_student_coral(tmp_path / "student-run")
    (roots.iterdir().__next__() / "code" / "solution.py").write_text("VALUE = 1.2\n")
    model = FakeModel(script).start()
    try:
        done = explore(tmp_path, roots, student, "off", model, "parallel = 1\n")
        assert done.returncode == 1, done.stderr
        assert (
            "the grader scored the root T001 1.2 where the Student run recorded 1.0 (tolerance 1e-06 + "
            "0.05 x |recorded|)"
        ) in done.stderr, done.stderr
        assert "Graded #1" in done.stderr and [q for q in model.requests if q["tools"]] == []
        # A wider tolerance lets it pass: the same roots, the same grader.
        wide = (
            "parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n"
            "[backend_options.grader_check_tolerance]\nrelative = 0.25\n"
        )
        done = explore(tmp_path, roots, student, "wide", model, wide)
    finally:
        model.stop()
    assert done.returncode == 0, done.stderr
    assert catalog(tmp_path, "wide").query("select score, outcome from int_grader_checks") == [
        {"score": 1.2, "outcome": "passed"}
    ]
    assert replay(tmp_path, "off").exit_code == 0 and replay(tmp_path, "wide").exit_code == 0


@pytest.mark.slow
def test_the_right_coral_dir_passes_the_check_and_it_is_recorded_before_the_first_turn(tmp_path, roots):
    student = make_student_coral(tmp_path / "student-run")
    model = FakeModel(script).start()
    try:
        done = explore(
            tmp_path, roots, student, "right", model, "parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n"
        )
    finally:
        model.stop()
    assert done.returncode == 0, done.stderr
    cat = catalog(tmp_path, "right")
    checks = cat.query("select seq, tree_id, score, recorded_score, eval_status, outcome from int_grader_checks")
    assert [{k: v for k, v in c.items() if k != "seq"} for c in checks] == [
        {"tree_id": "T001", "score": 1.0, "recorded_score": 1.0, "eval_status": "improved", "outcome": "passed"}
    ]
    first_turn = cat.query("select min(seq) as seq from stg_turn_finished")[0]["seq"]
    assert first_turn is not None and checks[0]["seq"] < first_turn
    assert count(cat, "stg_run_stopped") == 0 and count(cat, "stg_run_finished") == 1
    check_left_nothing(tmp_path, "right")
    assert replay(tmp_path, "right").exit_code == 0


@pytest.mark.slow
def test_without_the_check_a_streak_of_crashed_evals_stops_the_run_and_replays(tmp_path, roots):
    """--no-grader-check with another task's grader: the first eval_error_limit edges crash
    with the same error, and the run stops with it (exit 1), those turns recorded."""
    other = make_student_coral(tmp_path / "other-task", grader=OTHER_GRADER)
    model = FakeModel(script).start()
    config = tmp_path / "streak.toml"
    try:
        done = explore(
            tmp_path, roots, other, "streak", model, "parallel = 1\n[tree]\nroot_children = 3\n", "--no-grader-check"
        )
        # A stop ends the streak: resumed (the grader still broken), the run stops after three more.
        resumed = (
            opencode_process(
                ["--data", str(tmp_path / "data"), "explore", "--resume", "streak"], tmp_path, model, config
            )
            if done.returncode == 1
            else None
        )
    finally:
        model.stop()
    assert done.returncode == 1, done.stderr
    assert (
        "Error: the evals of the last 3 edges all failed with the same error: [Errno 2] No such file or directory"
    ) in done.stderr and "kernel.cu" in done.stderr, done.stderr
    assert "explore --resume streak" in done.stderr and "Traceback" not in done.stderr
    cat = catalog(tmp_path, "streak")
    assert count(cat, "stg_grader_checked") == 0, "the check ran although it was skipped"
    streak = cat.query("select edge_id, failed, streak from int_edges__eval_errors order by judged_seq")
    assert [s["streak"] for s in streak] == [1, 2, 3, 1, 2, 3], streak
    ran = cat.query("select eval_status, count(*) as n from turns where not skipped group by all")
    assert [r["eval_status"] for r in ran] == ["crashed"] and ran[0]["n"] >= 6, ran  # every eval crashed
    stops = cat.query("select seq, reason from stg_run_stopped order by seq")
    assert [s["reason"] for s in stops] == ["eval_errors", "eval_errors"]
    resumed_at = cat.query("select seq from stg_run_resumed")[0]["seq"]
    assert stops[0]["seq"] < resumed_at < stops[1]["seq"]
    assert (
        cat.query(
            "select count(*) as n from stg_edge_started where seq > ? and seq < ?", [stops[0]["seq"], resumed_at]
        )[0]["n"]
        == 0
    )
    assert count(cat, "stg_run_finished") == 0
    assert resumed is not None and resumed.returncode == 1, resumed.stderr if resumed else done.stderr
    assert "Error: the evals of the last 3 edges all failed" in resumed.stderr, resumed.stderr
    assert marked_processes(EventLog(tmp_path / "data", "streak").dir) == []
    r = replay(tmp_path, "streak")
    events = cat.query(
        "select seq, kind, edge_id, turn from events where kind in ('edge_started', 'turn_finished', "
        "'edge_judged', 'run_stopped', 'run_resumed', 'turn_skipped') order by seq"
    )
    assert r.exit_code == 0 and "0 differ" in r.stdout, (r.output, events)
    # Replay re-derives the stop: one recorded where no streak was due is a difference.
    with LogWriter.open(tmp_path / "data", "streak") as writer:
        writer.append([RunStopped(watermark=3, reason="eval_errors", error="made up")])
    r = replay(tmp_path, "streak")
    assert r.exit_code == 1 and "run_stopped" in r.stdout and "stopped with no stop due" in r.stdout, r.output
