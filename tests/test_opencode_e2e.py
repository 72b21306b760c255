"""The OpenCode backend end to end: real opencode, real git, a scripted model server.

With --coral-dir every edge gets a CORAL run of its own and the stand-in `coral`
(tests/fixtures/coral_standin, which behaves like CORAL's) commits there and its
grader daemon scores the commit; without it, a self-contained eval command
(tests/fixtures/bin/local-eval) grades in the worktree. The fake model server
(tests/fake_model.py) plays a scripted turn: read a shared note, read a missing file
(a failing tool call), write solution.py, run the eval command, answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, make_snapshot
from coral_task import digest, make_student_coral
from fake_model import FakeModel, Stall

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog

OPENCODE = ROOT / "node_modules" / ".bin" / "opencode"
CRASHING = ("T001/e1-1", 1)  # this turn writes code the grader cannot score


def value_for(edge: str, turn: int) -> str:
    if (edge, turn) == CRASHING:
        return "CRASH"
    depth = edge.split("/")[0].count(".") + 1
    slot = int(edge.split("/e")[1].split("-")[0])
    return f"{1.0 + 0.1 * depth + 0.01 * slot + 0.001 * turn:.3f}"


def script(edge: str, turn: int, step: int, workdir: str, eval_command: str = "coral eval -m"):
    if step == 0:
        return [
            ("read", {"filePath": f"{workdir}/.opencode/notes/tiling.md"}),
            ("read", {"filePath": f"{workdir}/does_not_exist.txt"}),
        ]
    if step == 1:
        return [("write", {"filePath": f"{workdir}/solution.py", "content": f"VALUE = {value_for(edge, turn)}\n"})]
    if step == 2:
        return [("bash", {"command": f'{eval_command} "edge {edge} turn {turn}"', "description": "submit the attempt"})]
    return f"Done with {edge} turn {turn}."


def local_script(edge: str, turn: int, step: int, workdir: str):
    return script(edge, turn, step, workdir, "local-eval -m")


# Pending attempts the root's shared dir holds (the snapshot was saved while they waited
# for the grader): another agent's, and one of the agent id the Teacher evaluates as.
PENDING = {f"{'c' * 39}{i}": agent for i, agent in enumerate(["agent-2", "teacher"])}


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "roots"
    folder = make_snapshot(root, 1, score=1.0)
    (folder / "code" / "solution.py").write_text("VALUE = 1.0\n")
    notes = folder / "shared" / "notes"
    notes.mkdir()
    (notes / "tiling.md").write_text("# Tiling\nTiles of 64 were best.\n")
    for commit, agent in PENDING.items():
        (folder / "shared" / "attempts" / f"{commit}.json").write_text(
            json.dumps(
                {
                    "commit_hash": commit,
                    "agent_id": agent,
                    "title": "waiting",
                    "score": None,
                    "status": "pending",
                    "parent_hash": None,
                    "timestamp": "2026-01-01T00:00:00+00:00",
                    "feedback": "",
                }
            )
        )
    return root


@pytest.fixture
def student(tmp_path: Path) -> Path:
    """The Student run's .coral (config, grader in private/, shared dirs), beside its repo."""
    return make_student_coral(tmp_path / "student-run")


@pytest.fixture
def coral_on_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{ROOT / 'tests' / 'fixtures' / 'bin'}{os.pathsep}{os.environ['PATH']}")


def explore_opencode(data: Path, roots: Path, model: FakeModel, config: Path, run_id: str, *extra):
    return CliRunner().invoke(
        cli,
        [
            "--data",
            str(data),
            "explore",
            str(roots),
            "--task",
            "speedup",
            "--run-id",
            run_id,
            "--backend",
            "opencode",
            "--model",
            "fake/scripted",
            "--endpoint",
            model.base_url,
            "--config",
            str(config),
            *extra,
        ],
    )


def test_opencode_binary_is_installed():
    assert OPENCODE.exists(), "run `npm install` (package-lock.json pins opencode-ai)"


def marked_processes(run_dir: Path) -> list[int]:
    """Live processes carrying the run's marker (every process its turns started has it)."""
    needle = f"TEACHER_MCTS_RUN={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_small_opencode_run_records_what_the_model_did(tmp_path, roots, student, coral_on_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODEL_KEY", "secret-4242")
    model = FakeModel(script).start()
    config = tmp_path / "run.toml"
    config.write_text(
        "parallel = 2\n[tree]\nroot_children = 2\nmax_children = 1\nmax_depth = 2\ntarget_good_leaves = 2\n"
    )
    data = tmp_path / "data"
    before = digest(student.parent)
    try:
        r = explore_opencode(
            data, roots, model, config, "oc", "--api-key-env", "FAKE_MODEL_KEY", "--coral-dir", str(student)
        )
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    assert digest(student.parent) == before, "the Student run changed"
    assert marked_processes(EventLog(data, "oc").dir) == [], "a grader daemon or session outlived its turn"
    cat = Catalog.for_log(EventLog(data, "oc"))
    # The key reaches the endpoint and never the log.
    assert {r["authorization"] for r in model.requests} == {"Bearer secret-4242"}
    log_dir = EventLog(data, "oc").log_dir
    assert all(b"secret-4242" not in p.read_bytes() for p in log_dir.iterdir())

    # Every turn that ran made the scripted calls, with the missing file failing.
    calls = cat.query("select edge_id, turn, tool, status, is_knowledge, target from tool_calls order by seq")
    turns = cat.query("select * from turns where not skipped order by edge_id, turn")
    edges = {e["edge_id"]: e for e in cat.query("select * from edges")}
    assert len(turns) == 9, sorted((k, e["verdict"], e["s1"], e["s2"], e["started_seq"]) for k, e in edges.items())
    for t in turns:
        mine = [c for c in calls if (c["edge_id"], c["turn"]) == (t["edge_id"], t["turn"])]
        # The two reads run in parallel (recorded in the order the model made them: test_export_e2e).
        got = sorted(
            (c["tool"], c["status"], c["is_knowledge"], c["target"] if c["tool"] == "bash" else Path(c["target"]).name)
            for c in mine
        )
        assert got == [
            ("bash", "ok", False, f'coral eval -m "edge {t["edge_id"]} turn {t["turn"]}"'),
            ("read", "error", False, "does_not_exist.txt"),
            ("read", "ok", True, "tiling.md"),
            ("write", "ok", False, "solution.py"),
        ], cat.query(
            "select outcome, error, wall_seconds from stg_turn_finished where edge_id = ? and turn = ?",
            [t["edge_id"], t["turn"]],
        )
        assert (t["tool_calls"], t["tool_errors"], t["knowledge_actions"]) == (4, 1, 1)
        assert t["steps"] == 4 and t["context_tokens"] > 1000
    # Scores are what CORAL's daemon graded from the code the model wrote, with the
    # Student's grader; the daemon's output is kept with each eval.
    evals = {
        (e["edge_id"], e["turn"]): e
        for e in cat.query("select edge_id, turn, commit_hash, eval_status, source from stg_eval_finished")
    }
    logs = {
        (r["edge_id"], r["turn"]): r["grader_log"]
        for r in EventLog(data, "oc").read_table(["kind", "edge_id", "turn", "grader_log"]).to_pylist()
        if r["kind"] == "eval_finished"
    }
    for t in turns:
        expected = value_for(t["edge_id"], t["turn"])
        assert t["score"] == (None if expected == "CRASH" else float(expected)), t
        e = evals[(t["edge_id"], t["turn"])]
        assert e["source"] == "attempt_json"
        assert e["eval_status"] == ("crashed" if expected == "CRASH" else "improved")
        assert f"{e['commit_hash'][:12]} -> score=" in logs[(t["edge_id"], t["turn"])]
    # The crashed turn 1 of a first layer-1 attempt: turn 2 skipped, retried.
    assert edges["T001/e1-1"]["verdict"] == "retry" and edges["T001/e1-1"]["skip_turn2"] is True
    assert cat.query("select edge_id from stg_turn_skipped") == [{"edge_id": "T001/e1-1"}]
    assert {e["verdict"] for k, e in edges.items() if k != "T001/e1-1"} == {"kept"}
    # tool errors are 2 of 8 calls = 25% <= 30%: kept, cleanliness 0.8 - 0.5*0.25/0.3.
    assert edges["T001/e2-1"]["cleanliness"] == pytest.approx(0.8 - 0.5 * 0.25 / 0.3)

    # A forked session's first request carries its parent's conversation, not a sibling's.
    child = edges["T001.1/e1-1"]
    sessions = {(t["edge_id"], t["turn"]): t["session_id"] for t in turns}
    first = model.first_request_of(sessions[("T001.1/e1-1", 1)])
    text = json.dumps(first["messages"])
    parent_edge = next(e for e in edges.values() if e["child_id"] == "T001.1")["edge_id"]
    sibling_edge = next(e for e in edges.values() if e["child_id"] == "T001.2")["edge_id"]
    said = {  # what each edge's model answered (the script names its edge and turn): the prompts name neither
        e: [f"Done with {e} turn {t}." for t in (1, 2)] for e in (parent_edge, sibling_edge)
    }
    assert all(a in text for a in said[parent_edge]) and not any(a in text for a in said[sibling_edge])
    assert child["parent_id"] == "T001.1"
    sibling_first = json.dumps(model.first_request_of(sessions[(sibling_edge, 1)])["messages"])
    assert not any(a in sibling_first for a in said[parent_edge])  # fresh sessions share nothing
    assert "[edge" not in text  # no prompt names an attempt

    # Worktrees: the retried attempt's is gone, kept nodes keep theirs, commits exist.
    worktrees = EventLog(data, "oc").dir / "worktrees" / "T001"
    assert not (worktrees / "T001_e1-1").exists()
    assert (worktrees / "T001_e2-1" / "wt" / "solution.py").exists()
    # The shared state after each turn: the held pending attempts as they were, the
    # turn's own attempt graded, one grading counted, no checkpoint repository (nor its
    # .gitignore) or daemon files; the breadcrumbs were never committed.
    root_attempts = roots / next(roots.iterdir()).name / "shared" / "attempts"
    for turn in (1, 2):
        shared = worktrees / "T001_e2-1" / f"shared-t{turn}"
        commit = evals[("T001/e2-1", turn)]["commit_hash"]
        assert sorted(p.name for p in shared.iterdir()) == ["attempts", "eval_count", "notes"]
        assert (shared / "eval_count").read_text() == str(turn)
        for pending in PENDING:
            assert (shared / "attempts" / f"{pending}.json").read_bytes() == (
                root_attempts / f"{pending}.json"
            ).read_bytes()
        attempt = json.loads((shared / "attempts" / f"{commit}.json").read_text())
        assert attempt["agent_id"] == "teacher" and attempt["status"] == "improved"
        tracked = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", commit],
            cwd=worktrees / "repo",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert tracked == ["solution.py"]
    assert (
        subprocess.run(
            ["git", "worktree", "list"], cwd=worktrees / "repo", capture_output=True, text=True
        ).stdout.count("grader_checkouts")
        == 0
    )
    # CORAL checkpointed the shared dir in a repository inside it (.opencode/.git); turn 2
    # started without turn 1's, so its repository holds turn 2's checkpoints only.
    checkpoints = subprocess.run(
        ["git", "log", "--format=%s"],
        cwd=worktrees / "T001_e2-1" / "wt" / ".opencode",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert checkpoints[-1] == "init: shared state tracking" and not any("turn 1" in c for c in checkpoints)
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "oc"]).exit_code == 0
    # The recorded config names the key's variable, never the key.
    options = json.loads(cat.query("select config from stg_run_started")[0]["config"])["backend_options"]
    assert options["model"] == "fake/scripted" and options["api_key_env"] == "FAKE_MODEL_KEY"


def opencode_pids(home: Path) -> set[int]:
    needle = f"XDG_DATA_HOME={home}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.add(int(entry))
            except OSError:
                continue
    return found


def survivors(seen: set[int], home: Path) -> list[int]:
    """The OpenCode processes still alive (killed, so that no other test meets them)."""
    alive = [pid for pid in seen | opencode_pids(home) if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


@pytest.mark.slow
def test_a_model_that_never_answers_a_turn_stops_the_run_and_leaves_no_process(tmp_path, roots, student, coral_on_path):
    """The endpoint answers its check, then no turn's request: each turn waits out its timeout,
    is a backend failure, never an edge the tree keeps; backend_error_limit of them stop the
    run (exit 1) with nothing recorded. No process outlives a timed-out turn: OpenCode's,
    its tools', CORAL's grader daemon."""
    model = FakeModel(script, stall=True).start()
    config = tmp_path / "run.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n")
    data = tmp_path / "data"
    home = EventLog(data, "stall").dir / "opencode" / "data"
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(opencode_pids(home))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = explore_opencode(data, roots, model, config, "stall", "--turn-timeout", "6", "--coral-dir", str(student))
    finally:
        done.set()
        watcher.join()
        model.stop()
    assert r.exit_code == 1, r.output
    assert seen, "no opencode process was observed"
    alive = survivors(seen, home)
    assert alive == [], f"processes survived: {alive}"
    assert "the last 3 turns failed with a backend error, the last one: the model never answered" in r.stderr
    assert f"at {model.base_url}: turn timed out after 6 s of work" in r.stderr and "explore --resume stall" in r.stderr
    assert len([q for q in model.requests if q["tools"]]) >= 3  # three turns asked, none was answered
    cat = Catalog.for_log(EventLog(data, "stall"))
    assert cat.query("select count(*) as n from stg_turn_finished")[0]["n"] == 0
    assert cat.query("select count(*) as n from edges where verdict is not null")[0]["n"] == 0
    assert cat.query("select count(*) as n from nodes where depth > 0")[0]["n"] == 0


def graded_then_silent(edge: str, turn: int, step: int, workdir: str):
    """Turn 1 of the first edge is graded (1.5), then its final request is never answered."""
    if (edge, turn) == ("T001/e1-1", 1) and step == 1:
        return [("write", {"filePath": f"{workdir}/solution.py", "content": "VALUE = 1.5\n"})]
    if (edge, turn) == ("T001/e1-1", 1) and step == 3:
        return Stall()
    return script(edge, turn, step, workdir)


@pytest.mark.slow
def test_a_turn_that_times_out_after_its_eval_was_graded_keeps_the_score(tmp_path, roots, student, coral_on_path):
    """CORAL graded the turn's attempt, then the turn timed out waiting for the model: the log
    records the grade (as the attempt file has it), the next turn starts from that commit and
    is judged against it, the steps are the requests the model answered, and the path's
    sample is what the model received."""
    model = FakeModel(graded_then_silent).start()
    model.delay_s = 0.4  # the model's time, which the turns' phases must show
    config = tmp_path / "run.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n")
    data = tmp_path / "data"
    try:
        # 60 s: ample for OpenCode's start, three answers and the grading, even on a loaded machine.
        r = explore_opencode(data, roots, model, config, "late", "--turn-timeout", "60", "--coral-dir", str(student))
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    cat = Catalog.for_log(EventLog(data, "late"))
    turns = {
        (t["edge_id"], t["turn"]): t
        for t in cat.query("select edge_id, turn, score, outcome, steps, session_id, state from int_turns")
    }
    late, after = turns[("T001/e1-1", 1)], turns[("T001/e1-1", 2)]
    requests = [q for q in model.requests if q["session"] == late["session_id"] and q["tools"]]
    assert [q["answered"] for q in requests] == [200, 200, 200, None], "the turn did not reach its silent request"
    assert late["outcome"] == "timeout" and late["score"] == 1.5
    (graded,) = cat.query("select * from stg_eval_finished where edge_id = 'T001/e1-1' and turn = 1")
    state = json.loads(late["state"]) if isinstance(late["state"], str) else late["state"]
    attempt = json.loads((Path(state["shared"]) / "attempts" / f"{graded['commit_hash']}.json").read_text())
    recorded = (graded["score"], graded["eval_status"], graded["source"])
    assert recorded == (attempt["score"], attempt["status"], "attempt_json")
    assert state["commit"] == graded["commit_hash"] == attempt["commit_hash"]
    # The steps are the model's answers, not the request it never answered.
    assert late["steps"] == 3
    # Turn 2 went on from that commit, and is judged against turn 1's grade.
    first = model.first_request_of(after["session_id"])
    assert "Done with T001/e1-1 turn 1." not in json.dumps(first["messages"])  # (turn 1 never answered last)
    assert len([m for m in first["messages"] if m["role"] == "user"]) == 2  # turn 1's prompt, then turn 2's
    (edge,) = cat.query("select s1, s2, regression_stability, verdict from edges")
    assert (edge["s1"], edge["s2"]) == (1.5, float(value_for("T001/e1-1", 2)))
    # Turn 2's 1.112 regressed against turn 1's 1.5 (against the root's 1.0, had the grade been lost, it would not).
    assert edge["regression_stability"] == 0.5 and edge["verdict"] == "kept"
    # The path through it is exported as the model received it.
    out = tmp_path / "train"
    done = CliRunner().invoke(cli, ["--data", str(data), "export", "late", "--out", str(out)])
    assert done.exit_code == 0, done.output
    (sample,) = [json.loads(line) for line in (out / "late.chat.jsonl").read_text().splitlines()]
    last = [q for q in model.requests if q["session"] == after["session_id"] and q["tools"]][-1]
    worktrees = re.escape(str((data / "runs" / "late" / "worktrees").resolve()))
    placed = json.loads(re.sub(worktrees + r"/T001/[^/\"]+/wt", "/workspace", json.dumps(last["messages"])))
    assert sample["messages"] == [*placed, {"role": "assistant", "content": "Done with T001/e1-1 turn 2."}]
    # Where the turns' time went: OpenCode's start, the model's 0.4 s an answer, the tools (the eval among them).
    phases = {p["turn"]: p for p in cat.query("select * from turn_phases where edge_id = 'T001/e1-1'")}
    # The turn timeout counts the turn's work, from its first request to the model: not OpenCode's start.
    assert phases[1]["wall_seconds"] >= phases[1]["startup_seconds"] + 60
    for turn, answered in ((1, 3), (2, 4)):
        p = phases[turn]
        assert p["node"] == "local" and 0 < p["startup_seconds"] < p["wall_seconds"], p
        assert answered * 0.4 <= p["model_seconds"] < p["wall_seconds"], p
        assert 0 < p["eval_seconds"] <= p["tool_seconds"], p
        assert p["startup_seconds"] + p["model_seconds"] + p["tool_seconds"] + p["other_seconds"] == pytest.approx(
            p["wall_seconds"], abs=0.01
        )
    summary = {(r["node"], r["phase"]): r for r in cat.query("select * from phase_times")}
    assert {phase for node, phase in summary} == {"wall", "startup", "model", "tools", "eval", "other"}
    assert summary[("*", "model")]["turns"] == 2 and {node for node, _ in summary} == {"*"}  # one node
    assert summary[("*", "wall")]["total_seconds"] == pytest.approx(sum(p["wall_seconds"] for p in phases.values()))
    from engine.collection import Collection
    from engine.web import data as web

    shown = web.run_page(Collection(data, ["late"]), "late")["phases"]  # serve's run page
    assert [r["phase"] for r in shown] == ["startup", "model", "tools", "eval", "other"]
    assert shown[1]["p50_seconds"] == summary[("*", "model")]["p50_seconds"]
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "late"]).exit_code == 0


@pytest.mark.slow
def test_a_turn_whose_opencode_never_reaches_the_model_within_the_start_up_limit_is_a_backend_error(
    tmp_path, roots, coral_on_path
):
    """OpenCode needs a while to send a turn's first request (seconds for a process, tenths of a
    second for a served session's new instance): with a start-up limit of 0.05 s every turn is
    cut before it, each a backend failure, and the run stops with the reason."""
    model = FakeModel(local_script).start()
    config = tmp_path / "slow.toml"
    config.write_text(
        "parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n[backend_options]\nstartup_timeout_s = 0.05\n"
    )
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "slow", "--eval-command", "local-eval -m")
    finally:
        model.stop()
    assert r.exit_code == 1, r.output
    assert "the last 3 turns failed with a backend error" in r.stderr
    assert "opencode sent no request to the model within 0.05 s of its start (startup_timeout_s)" in r.stderr
    assert [q for q in model.requests if q["tools"]] == []
    assert marked_processes(EventLog(data, "slow").dir) == []


def start_explore_until_sessions_run(data: Path, roots: Path, model: FakeModel, run_id: str, student: Path):
    """``explore`` (opencode, 2 turns at once, --coral-dir) in a process, once both sessions asked
    the model.

    Returns the process and the pids of the processes seen (OpenCode's, the grader daemons).
    """
    config = data.parent / f"{run_id}.toml"
    config.write_text("parallel = 2\n[tree]\nroot_children = 2\nmax_depth = 1\n")
    env = dict(os.environ, PATH=f"{ROOT / 'tests' / 'fixtures' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(roots),
            "--task",
            "speedup",
            "--run-id",
            run_id,
            "--backend",
            "opencode",
            "--model",
            "fake/scripted",
            "--endpoint",
            model.base_url,
            "--config",
            str(config),
            "--turn-timeout",
            "600",
            "--coral-dir",
            str(student),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    home = EventLog(data, run_id).dir / "opencode" / "data"
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while len(model.requests) < 2 and time.monotonic() < deadline and proc.poll() is None:
        seen |= opencode_pids(home)
        time.sleep(0.1)
    seen |= opencode_pids(home)
    return proc, seen


@pytest.mark.slow
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGTERM, signal.SIGINT]], ids=["TERM", "TERM+INT"])
def test_sigterm_stops_the_teacher_sessions_in_flight(tmp_path, roots, student, signals):
    """A scheduler's SIGTERM (preemption, ``timeout``), and ``timeout``'s SIGINT after it while
    the first unwinds, must not orphan OpenCode sessions or daemons nor lose the message."""
    model = FakeModel(script, stall=True).start()
    data = tmp_path / "data"
    proc, seen = start_explore_until_sessions_run(data, roots, model, "term", student)
    try:
        assert len(model.requests) >= 2 and seen, "the two turns did not start"
        seen |= set(marked_processes(EventLog(data, "term").dir))
        for sig in signals:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        model.stop()
    alive = wait_until_gone(seen | set(marked_processes(EventLog(data, "term").dir)))
    survivors(set(alive), EventLog(data, "term").dir / "opencode" / "data")  # so that no other test meets them
    assert alive == [], f"processes survived: {alive}"
    # Two signals pending at once are handled in signal-number order (SIGINT first): the
    # exit is the first handled one's, with its message.
    ends = {(143, "Terminated by SIGTERM.")} | ({(130, "Interrupted.")} if len(signals) > 1 else set())
    assert (proc.returncode, err.rstrip().splitlines()[-1]) in ends, err
    assert "Traceback" not in err
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "term"]).exit_code == 0


def wait_until_gone(pids: set[int], deadline_s: float = 120) -> list[int]:
    """The pids still alive once they are all gone or the deadline passed."""
    deadline = time.monotonic() + deadline_s
    while (alive := sorted(p for p in pids if Path(f"/proc/{p}").exists())) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.slow
def test_kill_9_of_explore_stops_its_sessions_at_once_and_resume_completes(tmp_path, roots, student, coral_on_path):
    """kill -9 skips every cleanup: the watchdog must stop the sessions and grader daemons
    (no more edits, commits or grading on the run's behalf), without waiting for a resume."""
    model = FakeModel(script, stall=True).start()
    data = tmp_path / "data"
    run_dir = EventLog(data, "k9").dir
    proc, seen = start_explore_until_sessions_run(data, roots, model, "k9", student)
    try:
        assert len(model.requests) >= 2 and seen, "the two turns did not start"
        running = seen | set(marked_processes(run_dir))
        assert any(
            b"coral.grader.daemon" in Path(f"/proc/{pid}/cmdline").read_bytes()
            for pid in running
            if Path(f"/proc/{pid}").exists()
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        still = wait_until_gone(running)
        model.stall = False
        r = CliRunner().invoke(cli, ["--data", str(data), "explore", "--resume", "k9"])
    finally:
        if proc.poll() is None:
            proc.kill()
        model.stop()
        alive = survivors(seen, run_dir / "opencode" / "data")
    assert still == [], f"processes of the killed run kept running: {still}"
    assert r.exit_code == 0, r.output
    assert alive == [] and marked_processes(run_dir) == []
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "k9"]).exit_code == 0


def test_opencode_backend_errors_are_clean(tmp_path, roots):
    r = CliRunner().invoke(
        cli, ["--data", str(tmp_path / "data"), "explore", str(roots), "--task", "t", "--backend", "opencode"]
    )
    assert r.exit_code == 1 and "opencode backend options: model" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('backend = "opencode"\n[backend_options]\nmodel = "a/b"\napi_key = "sk-123"\n')
    r = CliRunner().invoke(
        cli, ["--data", str(tmp_path / "data"), "explore", str(roots), "--task", "t", "--config", str(bad)]
    )
    assert r.exit_code == 1 and "api_key_env" in r.stderr and "sk-123" not in r.output
    assert not (tmp_path / "data" / "runs").exists() or not any((tmp_path / "data" / "runs").iterdir())
    assert shutil.which("git")


def test_an_endpoint_that_does_not_answer_the_run_s_model_is_refused_before_the_run(
    tmp_path, roots, coral_on_path, monkeypatch
):
    """docs/REAL_RUNS.md followed with nothing listening, or a server that does not serve the
    model: the run is refused at once, says why, and nothing of it exists."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nothing = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    refusing = FakeModel(script, fail_status=404).start()
    silent = socket.socket()  # accepts, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    cases = [
        (nothing, "30", "cannot reach it"),
        (refusing.base_url, "30", "it answered HTTP 404: model not found"),
        (f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "2", "no answer within 2 s"),
    ]
    try:
        for endpoint, timeout, why in cases:
            data = tmp_path / "data"
            args = ["--data", str(data), "explore", str(roots), "--task", "t", "--backend", "opencode"]
            args += ["--model", "fake/scripted", "--endpoint", endpoint, "--turn-timeout", timeout]
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 1, r.output
            assert f"the model endpoint {endpoint} does not answer for model 'scripted': {why}" in r.stderr
            assert "no turn ran" in r.stderr and "Traceback" not in r.output
            assert not data.exists() or not any((data / "runs").glob("*")), "a run was created"
    finally:
        refusing.stop()
        silent.close()
    assert [q["body"]["model"] for q in refusing.requests] == ["scripted"]
    # A key with a line break (a file read with its newline) cannot be sent: said, never echoed.
    monkeypatch.setenv("BROKEN_KEY", "sk-secret-77\n")
    args = ["--data", str(tmp_path / "data"), "explore", str(roots), "--task", "t", "--backend", "opencode"]
    args += ["--model", "fake/scripted", "--endpoint", nothing, "--api-key-env", "BROKEN_KEY"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1 and "the API key (the variable api_key_env names) holds a line break" in r.stderr
    assert "sk-secret-77" not in r.output


def test_a_run_refused_after_its_opencode_store_was_made_leaves_nothing_of_it(tmp_path, roots, student, coral_on_path):
    """A CORAL whose Python cannot import the grader daemon is found once the run's OpenCode store
    exists: the run is refused, says why, and its directory is gone; a run that exists (a resume)
    is never removed by a refusal."""
    python = tmp_path / "python-without-coral"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'coral'\" >&2\nexit 1\n")
    python.chmod(0o755)
    config = tmp_path / "run.toml"
    outside = tmp_path / "elsewhere" / "worktrees"  # the run's worktrees outside its directory: made, then removed
    config.write_text(f'[backend_options]\ncoral_python = "{python}"\nworktree_root = "{outside}"\n')
    model = FakeModel(script).start()
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "refused", "--coral-dir", str(student))
    finally:
        model.stop()
    assert r.exit_code == 1, r.output
    assert "cannot import CORAL's grader daemon" in r.stderr and "Traceback" not in r.output
    assert not (data / "runs" / "refused").exists(), sorted((data / "runs").rglob("*"))[:10]
    assert not outside.exists() and (tmp_path / "elsewhere").is_dir()  # only what the run made
    # The same refusal of a run whose directory exists (as a resume's does) leaves it as it was.
    from engine.config import RunConfig
    from engine.teachers.opencode import OpenCodeTeacher
    from ingest.errors import InputError

    kept = data / "runs" / "kept"
    (kept / "log").mkdir(parents=True)
    options = {"model": "fake/scripted", "coral_dir": str(student), "coral_python": str(python)}
    with pytest.raises(InputError, match="grader daemon"):
        OpenCodeTeacher(RunConfig(task="t", backend="opencode", backend_options=options), kept)
    assert (kept / "log").is_dir()


@pytest.mark.slow
def test_more_concurrent_turns_than_the_memory_carries_are_refused_before_the_run(tmp_path, roots, coral_on_path):
    """--parallel × turn_memory_mb above the memory available: refused with the --parallel that
    fits, before the run exists (a run the OOM killer cuts loses its turns in flight)."""
    model = FakeModel(script).start()
    data = tmp_path / "data"
    config = tmp_path / "wide.toml"
    config.write_text("[backend_options]\nturn_memory_mb = 1000000\n")  # 1 TB a turn: more than this machine has
    try:
        base = ["--data", str(data), "explore", str(roots), "--task", "t", "--backend", "opencode"]
        base += ["--model", "fake/scripted", "--endpoint", model.base_url, "--config", str(config)]
        r = CliRunner().invoke(cli, [*base, "--parallel", "3"])
        assert not (data / "runs").exists() or not any((data / "runs").iterdir()), "a run was created"
        sim = CliRunner().invoke(cli, ["--data", str(data), "explore", str(roots), "--task", "t", "--parallel", "64"])
    finally:
        model.stop()
    assert r.exit_code == 1, r.output
    found = re.search(
        r"--parallel 3: 3 concurrent turns need about 3,000,000 MB \(1,000,000 MB each, "
        r"backend_options.turn_memory_mb\) and this machine has ([\d,]+) MB available: not even one turn fits",
        r.stderr,
    )
    assert found, r.stderr
    assert int(found[1].replace(",", "")) < 1_000_000 and "--executor ray" in r.stderr
    assert sim.exit_code == 0, sim.output  # the simulated Teacher's turns take no memory of their own


def opencode_process(args: list[str], cwd: Path, model: FakeModel, config: Path) -> subprocess.CompletedProcess:
    """``python cli.py ... explore --backend opencode`` in a process started in ``cwd`` (with
    ``--resume``: the run keeps its recorded backend, model, endpoint and config)."""
    env = dict(os.environ, PATH=f"{ROOT / 'tests' / 'fixtures' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("TEACHER_MCTS_DATA", None)
    options = (
        ["--backend", "opencode", "--model", "fake/scripted", "--endpoint", model.base_url, "--config", str(config)]
        if "--resume" not in args
        else []
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args, *options, "--turn-timeout", "300"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.parametrize("data_option", [["--data", "data"], []], ids=["relative-data", "default-data"])
def test_a_relative_data_dir_from_inside_a_git_repository_works(tmp_path, roots, data_option):
    """The docs/REAL_RUNS.md recipe run from a checkout (a git repository) with ./data: every path given
    to git and OpenCode must be absolute (a relative one made git add the worktree at the
    checkout's own HEAD, and OpenCode fail to change into it). Without --coral-dir, a
    self-contained eval command grades inside the worktree."""
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "a checkout"]):
        subprocess.run(
            ["git", *args],
            cwd=cwd,
            check=True,
            capture_output=True,
            env=dict(
                os.environ,
                GIT_AUTHOR_NAME="a",
                GIT_AUTHOR_EMAIL="a@b",
                GIT_COMMITTER_NAME="a",
                GIT_COMMITTER_EMAIL="a@b",
            ),
        )
    config = tmp_path / "one.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n")
    model = FakeModel(local_script).start()
    try:
        done = opencode_process(
            [
                *data_option,
                "explore",
                str(roots),
                "--task",
                "speedup",
                "--run-id",
                "rel",
                "--eval-command",
                "local-eval -m",
            ],
            cwd,
            model,
            config,
        )
    finally:
        model.stop()
    assert done.returncode == 0, done.stderr
    cat = Catalog.for_log(EventLog(cwd / "data", "rel"))
    turns = cat.query("select edge_id, turn, score, outcome from turns where not skipped order by edge_id, turn")
    assert len(turns) == 3, turns  # the scripted crash of T001/e1-1 turn 1 (turn 2 skipped), the retry's two
    for t in turns:  # each turn ran in its worktree and coral scored the code the model wrote there
        expected = value_for(t["edge_id"], t["turn"])
        assert t["outcome"] == "completed" and t["score"] == (None if expected == "CRASH" else float(expected)), (
            t,
            cat.query("select edge_id, turn, outcome, error from stg_turn_finished order by seq"),
            done.stderr[-3000:],
        )
    worktree = cat.query("select json_extract_string(state, '$.worktree') as wt from stg_turn_finished")[0]["wt"]
    assert Path(worktree).is_absolute() and Path(worktree).is_relative_to(cwd / "data")
    assert subprocess.run(["git", "worktree", "list"], cwd=cwd, capture_output=True, text=True).stdout.count("\n") == 1


@pytest.mark.slow
def test_a_run_whose_turns_all_fail_with_a_backend_error_stops_and_resumes_after_the_fix(tmp_path, roots, student):
    """An endpoint that answers its check but refuses the agent's requests (tools): every turn
    fails the same way. The run must stop
    after backend_error_limit such turns with that error and exit 1, record none of them,
    leave no process, and complete on --resume once the endpoint works."""
    config = tmp_path / "two.toml"
    config.write_text("parallel = 2\n[tree]\nroot_children = 2\nmax_depth = 1\n")
    model = FakeModel(script, fail_status=400, fail_agent=True).start()
    data = tmp_path / "data"
    try:
        done = opencode_process(
            [
                "--data",
                str(data),
                "explore",
                str(roots),
                "--task",
                "speedup",
                "--run-id",
                "down",
                "--coral-dir",
                str(student),
            ],
            tmp_path,
            model,
            config,
        )
        assert done.returncode == 1, done.stderr
        assert "Error: the last 3 turns failed with a backend error" in done.stderr, done.stderr
        assert "tools are not supported" in done.stderr and "explore --resume down" in done.stderr
        assert "Traceback" not in done.stderr
        cat = Catalog.for_log(EventLog(data, "down"))
        assert cat.query("select count(*) as n from stg_turn_finished")[0]["n"] == 0
        assert (
            cat.query(
                "select schedule from run_config, (select json_extract_string(config, "
                "'$.schedule') as schedule from stg_run_started)"
            )[0]["schedule"]
            == "async"
        )
        assert survivors(set(), EventLog(data, "down").dir / "opencode" / "data") == []
        model.fail_status = None  # the endpoint is fixed
        resumed = opencode_process(["--data", str(data), "explore", "--resume", "down"], tmp_path, model, config)
    finally:
        model.stop()
    assert resumed.returncode == 0, resumed.stderr
    assert "run down: resuming task speedup" in resumed.stderr
    cat = Catalog.for_log(EventLog(data, "down"))
    edges = {e["edge_id"]: e["verdict"] for e in cat.query("select edge_id, verdict from edges")}
    assert edges["T001/e2-1"] == "kept"  # no failed turn of the broken endpoint made it a retry
    assert cat.query("select count(*) as n from turns where outcome = 'error'")[0]["n"] == 0
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "down"]).exit_code == 0


@pytest.mark.slow
def test_a_model_opencode_does_not_know_stops_the_run_with_opencode_s_reason(tmp_path, roots, student):
    """The endpoint answers the run's model, but the OpenCode config the run gives (its provider replaced
    by ``opencode_config``) does not know it: OpenCode stores each prompt and ends the session with a
    ``session.error``. Each turn is a backend error that says OpenCode's reason (it said only "opencode
    ended without an answer"), and the run stops after backend_error_limit of them."""
    config = tmp_path / "unknown.toml"
    config.write_text(
        "parallel = 1\n[tree]\nroot_children = 1\nmax_depth = 1\n[backend_options.opencode_config]\nprovider = {}\n"
    )
    model = FakeModel(script).start()
    data = tmp_path / "data"
    try:
        args = ["--data", str(data), "explore", str(roots), "--task", "speedup", "--run-id", "unknown"]
        done = opencode_process([*args, "--coral-dir", str(student)], tmp_path, model, config)
    finally:
        model.stop()
    assert done.returncode == 1, done.stderr
    assert "Error: the last 3 turns failed with a backend error" in done.stderr, done.stderr
    assert "Model not found: fake/scripted" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_session_continues_on_another_nodes_store(tmp_path, roots, coral_on_path):
    """Two Teachers of one run on two cluster nodes (two OpenCode stores): turn 1 on one,
    turn 2 and the child's fork on the other, then back; the model receives the whole
    conversation each time, and the nodes' stores are gone once their Teachers close."""
    from engine.config import RunConfig
    from engine.teachers import RootInfo, TurnRequest
    from engine.teachers.opencode import OpenCodeTeacher
    from ingest.events import ConversationRecorded

    model = FakeModel(local_script).start()
    config = RunConfig(
        task="speedup",
        backend="opencode",
        backend_options={
            "model": "fake/scripted",
            "endpoint": model.base_url,
            "eval_command": "local-eval -m",
            "node_store": str(tmp_path / "nodes"),
        },
    )
    run_dir = tmp_path / "run"
    a, b = OpenCodeTeacher(config, run_dir, "node-a"), OpenCodeTeacher(config, run_dir, "node-b")
    try:
        start = a.root_state(RootInfo("T001", str(next(roots.iterdir())), 1.0, None))
        ids = {"tree_id": "T001", "slot": 1, "attempt": 1, "direction": "maximize"}
        edge = {**ids, "edge_id": "T001/e1-1", "parent_id": "T001"}
        one = a.run_turn(TurnRequest(**edge, turn=1, start_state=start, fork=True), threading.Event())
        two = b.run_turn(TurnRequest(**edge, turn=2, start_state=one[-1].state, fork=False), threading.Event())
        child = {**ids, "edge_id": "T001.1/e1-1", "parent_id": "T001.1"}
        three = a.run_turn(TurnRequest(**child, turn=1, start_state=two[-1].state, fork=True), threading.Event())
        stores = [a.environment.home, b.environment.home]
    finally:
        a.close()
        b.close()
        model.stop()
    assert [f[-1].outcome for f in (one, two, three)] == ["completed"] * 3
    assert [f[-1].state["node"] for f in (one, two, three)] == ["node-a", "node-b", "node-a"]
    assert stores[0] != stores[1] and stores[0].is_relative_to(tmp_path / "nodes")
    assert all(f[-1].session_id for f in (one, two, three))
    sent = [next(f for f in facts if isinstance(f, ConversationRecorded)) for facts in (one, two, three)]
    assert sent[1].base == len(sent[0].messages) and sent[2].base == sent[1].base + len(sent[1].messages)
    assert [f.messages[-1]["content"] for f in sent] == [
        f"Done with {e} turn {t}." for e, t in [("T001/e1-1", 1), ("T001/e1-1", 2), ("T001.1/e1-1", 1)]
    ]
    assert not any(s.exists() for s in stores)
