"""Against the real CORAL (``CORAL_SRC``: a checkout of Human-Agent-Society/CORAL; CI cannot
install it, so these are skipped there): a small run made by ``coral start`` with a runtime
that starts no agent and evals made by hand, its attempts selected as roots, and an
OpenCode exploration of them whose ``coral eval`` is CORAL's, with ``--coral-dir``."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from coral_task import (
    GRADER,
    ROOT,
    attempts_in_order,
    check_written_root,
    coral_env,
    coral_eval,
    digest,
)
from fake_model import FakeModel
from test_opencode_e2e import explore_opencode, marked_processes, script, value_for

from cli import cli
from engine.catalog import Catalog
from engine.teachers.opencode.processes import kill_marked
from ingest.log import EventLog

pytestmark = [pytest.mark.real_coral, pytest.mark.slow]

EVALS = [("agent-1", "2.0"), ("agent-2", "1.5"), ("agent-1", "CRASH"), ("agent-2", "3.0"), ("agent-1", "4.0")]
TASK = """\
task:
  name: speedup
  description: Make VALUE in solution.py as large as possible.
grader:
  timeout: 60
  direction: maximize
agents:
  count: 2
  runtime: "idle_runtime:IdleRuntime"
  model: none
  heartbeat: []
workspace:
  results_dir: {results}
  repo_path: {seed}
run:
  session: local
"""
MARK = "TEACHER_MCTS_TEST_CORAL"


@pytest.fixture(scope="module")
def real_run(real_coral_bin, tmp_path_factory) -> Path:
    """A CORAL run by ``coral start``: 2 idle agents, the evals of EVALS by hand, one left pending."""
    base = tmp_path_factory.mktemp("real-coral")
    task = base / "task"
    (task / "eval").mkdir(parents=True)
    (task / "eval" / "grader.py").write_text(GRADER)
    (task / "seed").mkdir()
    (task / "seed" / "solution.py").write_text("VALUE = 1.0\n")
    (task / "task.yaml").write_text(TASK.format(results=base / "results", seed=task / "seed"))
    env = dict(
        coral_env(real_coral_bin), PYTHONPATH=str(ROOT / "tests" / "fixtures" / "coral_runtime"), **{MARK: str(base)}
    )
    with open(base / "start.log", "wb") as log:
        manager = subprocess.Popen(
            [str(real_coral_bin / "coral"), "start", "-c", str(task / "task.yaml")],
            cwd=task,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        run = base / "results" / "speedup" / "latest"
        deadline = time.monotonic() + 300
        while not (
            (run / ".coral" / "public" / "grader_daemon_heartbeat").exists()
            and (run / "agents" / "agent-2" / ".coral_agent_id").exists()
        ):
            assert manager.poll() is None and time.monotonic() < deadline, (base / "start.log").read_text()
            time.sleep(0.5)
        for agent, value in EVALS:
            tree = run / "agents" / agent
            (tree / "solution.py").write_text(f"VALUE = {value}\n")
            (tree / ".opencode" / "notes" / "tiling.md").write_text(f"# Tiling\n{agent} tried {value}.\n")
            done = coral_eval(real_coral_bin, tree, f"{agent} tries {value}")
            assert done.returncode == 0, done.stdout + done.stderr
    finally:
        kill_marked(str(base), MARK)  # the manager, its grader daemon, the idle agents
        manager.wait(timeout=60)
    tree = run / "agents" / "agent-2"
    (tree / "solution.py").write_text("VALUE = 5.0\n")
    done = coral_eval(real_coral_bin, tree, "agent-2 tries 5.0", "--no-wait")  # no daemon: stays pending
    assert done.returncode == 0 and "Status:  pending" in done.stdout, done.stdout + done.stderr
    return run.resolve()


def test_select_snapshots_of_a_real_coral_run(real_run, tmp_path):
    before = digest(real_run)
    out = tmp_path / "roots"
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(tmp_path / "data"),
            "select-snapshots",
            str(real_run),
            str(out),
            "--task",
            "speedup",
            "--num-roots",
            "3",
            "--run-id",
            "real",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    print(r.stdout)  # the real run's selection, for the record
    assert digest(real_run) == before, "the CORAL run changed"
    ordered = attempts_in_order(real_run)
    assert [a["title"] for a in ordered] == [f"{a} tries {v}" for a, v in EVALS] + ["agent-2 tries 5.0"]
    rows = Catalog.for_log(EventLog(tmp_path / "data", "real")).query(
        "select snapshot, eval_count, eval_ok, score, skip_reason from snapshots order by global_index"
    )
    assert [(row["eval_count"], row["eval_ok"], row["score"]) for row in rows[:-1]] == [
        (i, v != "CRASH", None if v == "CRASH" else float(v)) for i, (_, v) in enumerate(EVALS, start=1)
    ]
    assert rows[-1]["skip_reason"] == "pending: the attempt is not graded yet"
    by_name = {row["snapshot"]: a for row, a in zip(rows, ordered, strict=True)}
    doc = json.loads(r.stdout)
    assert len(doc["picks"]) == 3
    for pick in doc["picks"]:
        check_written_root(out / pick["snapshot"], real_run, by_name[pick["snapshot"]])


def test_an_opencode_exploration_graded_by_the_real_coral(real_run, real_coral_bin, tmp_path, monkeypatch):
    out = tmp_path / "roots"
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(tmp_path / "data"),
            "select-snapshots",
            str(real_run),
            str(out),
            "--task",
            "speedup",
            "--num-roots",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("PATH", coral_env(real_coral_bin)["PATH"])  # CORAL's `coral` first
    before = digest(real_run)
    config = tmp_path / "run.toml"
    config.write_text("parallel = 2\n[tree]\nroot_children = 2\nmax_depth = 1\n")
    data = tmp_path / "data"
    model = FakeModel(script).start()
    try:
        r = explore_opencode(data, out, model, config, "oc-real", "--coral-dir", str(real_run / ".coral"))
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    print(r.stdout)  # the exploration's summary, for the record
    assert digest(real_run) == before, "the Student run changed"
    assert marked_processes(EventLog(data, "oc-real").dir) == []
    cat = Catalog.for_log(EventLog(data, "oc-real"))
    turns = cat.query("select edge_id, turn, score, eval_status from turns where not skipped order by edge_id, turn")
    assert len(turns) == 5  # T001/e1-1 crashes in turn 1 (turn 2 skipped, retried), e1-2 and e2-1 run two
    for t in turns:
        expected = value_for(t["edge_id"], t["turn"])
        assert t["score"] == (None if expected == "CRASH" else float(expected)), t
        assert t["eval_status"] == ("crashed" if expected == "CRASH" else "improved"), t
    logs = [
        r["grader_log"]
        for r in EventLog(data, "oc-real").read_table(["kind", "grader_log"]).to_pylist()
        if r["kind"] == "eval_finished"
    ]
    assert all("Graded #" in log for log in logs), logs
    print(logs[0])  # CORAL's daemon, as recorded with the turn
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "oc-real"]).exit_code == 0
