"""Roots straight from a CORAL run: its attempts as candidate snapshots (``select-snapshots`` and
``explore --select`` on a run directory), on a run the test stand-in made as ``coral start``
lays it out, with evals made by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from coral_task import STAND_IN_BIN, attempts_in_order, check_written_root, digest, make_coral_run

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog

EVALS = [
    ("agent-1", "2.0"),
    ("agent-2", "1.5"),
    ("agent-1", "CRASH"),
    ("agent-2", "3.0"),
    ("agent-1", "4.0"),
    ("agent-2", "2.5"),
]
PENDING = [("agent-1", "5.0")]


@pytest.fixture(scope="module")
def coral_run(tmp_path_factory) -> Path:
    return make_coral_run(tmp_path_factory.mktemp("coral") / "run", STAND_IN_BIN, EVALS, PENDING)


def invoke(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.slow
def test_select_snapshots_takes_the_attempts_of_a_coral_run(coral_run, tmp_path):
    before = digest(coral_run)
    out = tmp_path / "roots"
    r = invoke(
        "--data",
        tmp_path / "data",
        "select-snapshots",
        coral_run,
        out,
        "--task",
        "speedup",
        "--num-roots",
        "3",
        "--run-id",
        "sel",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert digest(coral_run) == before, "the CORAL run changed"
    ordered = attempts_in_order(coral_run)
    assert [(a["agent_id"], a["title"]) for a in ordered] == [
        (agent, f"{agent} tries {v}") for agent, v in EVALS + PENDING
    ]
    names = [f"eval-{i:06d}-{a['agent_id']}-{a['commit_hash'][:12]}" for i, a in enumerate(ordered, start=1)]
    cat = Catalog.for_log(EventLog(tmp_path / "data", "sel"))
    rows = cat.query(
        "select snapshot, global_index, agent_id, eval_count, eval_ok, score, skip_reason "
        "from snapshots order by global_index"
    )
    assert [row["snapshot"] for row in rows] == names
    graded = [(row["eval_count"], row["eval_ok"], row["score"]) for row in rows[:-1]]
    assert graded == [(i, v != "CRASH", None if v == "CRASH" else float(v)) for i, (_, v) in enumerate(EVALS, 1)]
    assert rows[-1]["skip_reason"] == "pending: the attempt is not graded yet"
    doc = json.loads(r.stdout)
    assert len(doc["picks"]) == 3
    assert doc["skipped"] == [{"snapshot": names[-1], "skip_reason": rows[-1]["skip_reason"]}]
    by_name = dict(zip(names, ordered, strict=True))
    for pick in doc["picks"]:
        folder = out / pick["snapshot"]
        attempt = by_name[pick["snapshot"]]
        check_written_root(folder, coral_run, attempt)
        meta = json.loads((folder / "metadata.json").read_text())
        assert {k: meta[k] for k in ("commit_hash", "agent_id", "eval_ok", "score", "stage", "task")} == {
            "commit_hash": attempt["commit_hash"],
            "agent_id": attempt["agent_id"],
            "eval_ok": True,
            "score": attempt["score"],
            "stage": pick["stage"],
            "task": "speedup",
        }
    # The first attempt was submitted before public/ had a checkpoint repository: its shared
    # state is the repository's first commit.
    assert "shared_state_hash" not in ordered[0]
    first = out / names[0]
    if not first.exists():
        r = invoke(
            "--data",
            tmp_path / "data",
            "select-snapshots",
            coral_run,
            tmp_path / "all",
            "--task",
            "speedup",
            "--num-roots",
            "6",
        )
        assert r.exit_code == 0, r.output
        first = tmp_path / "all" / names[0]
    check_written_root(first, coral_run, ordered[0])
    # The written roots are ordinary snapshot folders: explore takes them as they are.
    r = invoke("--data", tmp_path / "data", "explore", out, "--run-id", "ex", "--config", small_config(tmp_path))
    assert r.exit_code == 0, r.output
    roots = Catalog.for_log(EventLog(tmp_path / "data", "ex")).query(
        "select snapshot, score from stg_root_added order by tree_id"
    )
    assert roots == [{"snapshot": p["snapshot"], "score": p["score"]} for p in doc["picks"]]


def small_config(tmp_path: Path) -> Path:
    config = tmp_path / "small.toml"
    config.write_text("[tree]\nroot_children = 1\nmax_depth = 1\n")
    return config


@pytest.mark.slow
def test_explore_select_writes_the_picked_attempts_into_the_run(coral_run, tmp_path):
    data = tmp_path / "data"
    r = invoke(
        "--data",
        data,
        "explore",
        coral_run / ".coral",
        "--select",
        "--task",
        "speedup",
        "--num-roots",
        "2",
        "--run-id",
        "direct",
        "--config",
        small_config(tmp_path),
    )
    assert r.exit_code == 0, r.output
    cat = Catalog.for_log(EventLog(data, "direct"))
    roots = cat.query("select snapshot, path from stg_root_added order by tree_id")
    assert len(roots) == 2
    by_name = {
        f"eval-{i:06d}-{a['agent_id']}-{a['commit_hash'][:12]}": a
        for i, a in enumerate(attempts_in_order(coral_run), start=1)
    }
    for root in roots:
        assert Path(root["path"]) == EventLog(data, "direct").dir / "roots" / root["snapshot"]
        check_written_root(Path(root["path"]), coral_run, by_name[root["snapshot"]])
        meta = json.loads((Path(root["path"]) / "metadata.json").read_text())
        assert (meta["direction"], meta["selection_run"]) == ("maximize", "direct")  # the CORAL config's
    assert invoke("--data", data, "replay", "direct").exit_code == 0


def test_a_coral_run_s_direction_and_broken_attempts(coral_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(coral_run, run, symlinks=True)
    (run / ".coral" / "config.yaml").write_text(
        (run / ".coral" / "config.yaml").read_text().replace("direction: maximize", "direction: minimize")
    )
    attempts = run / ".coral" / "public" / "attempts"
    (attempts / "broken.json").write_text("{not json")
    (attempts / "list.json").write_text("[]")
    (attempts / f"{'d' * 40}.json").write_text(
        json.dumps(
            {
                "commit_hash": "d" * 40,
                "agent_id": "agent-3",
                "title": "lost",
                "score": 9.0,
                "status": "improved",
                "parent_hash": None,
                "timestamp": "2020-01-01T00:00:00+00:00",
                "feedback": "",
            }
        )
    )
    r = invoke(
        "--data",
        tmp_path / "data",
        "select-snapshots",
        run,
        tmp_path / "out",
        "--task",
        "speedup",
        "--num-roots",
        "2",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["direction"] == "minimize"
    skipped = {s["snapshot"]: s["skip_reason"] for s in doc["skipped"]}
    assert skipped["broken.json"].startswith("invalid JSON in the attempt file")
    assert skipped["list.json"] == "the attempt file is not a JSON object"
    assert skipped[f"eval-000001-agent-3-{'d' * 12}"] == f"missing code/ (commit {'d' * 12} is not in {run / 'repo'})"
    assert {p["snapshot"].split("-")[1] for p in doc["picks"]} <= {f"{i:06d}" for i in range(2, 8)}
    # the copies carry it: explore and a re-selection take it from them
    assert {json.loads((f / "metadata.json").read_text())["direction"] for f in (tmp_path / "out").iterdir()} == {
        "minimize"
    }


def test_what_is_not_a_coral_run_is_refused_clearly(coral_run, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(coral_run / ".coral", empty / ".coral", symlinks=True)
    shutil.rmtree(empty / ".coral" / "public" / "attempts")
    (empty / ".coral" / "public" / "attempts").mkdir()
    r = invoke("--data", tmp_path / "data", "select-snapshots", empty, tmp_path / "out", "--task", "t")
    assert r.exit_code == 1
    assert r.stderr == f"Error: {empty / '.coral' / 'public' / 'attempts'}: the CORAL run has no attempts yet\n"
    shutil.copytree(
        coral_run / ".coral" / "public" / "attempts", empty / ".coral" / "public" / "attempts", dirs_exist_ok=True
    )
    r = invoke("--data", tmp_path / "data", "select-snapshots", empty, tmp_path / "out", "--task", "t")
    assert r.exit_code == 1
    assert r.stderr == f"Error: {empty}: a CORAL run without its repository (no repo/ with a .git)\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "data" / "runs").exists()
