"""``select-snapshots`` on real folders: skip reasons, errors, outputs, the recorded log."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, make_snapshot

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog


def invoke(data_dir: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data_dir), *map(str, args)])


def tree_digest(root: Path) -> str:
    """Hash of every path, mode and file content below ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + dirnames:
            path = Path(dirpath) / name
            st = path.lstat()
            h.update(f"{path.relative_to(root)}|{st.st_mode}|{st.st_size}\n".encode())
            if path.is_file() and not path.is_symlink():
                h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def snapshots(tmp_path: Path) -> Path:
    root = tmp_path / "all_snapshots"
    for i in range(1, 13):
        make_snapshot(root, i, agent=f"agent-{i % 2 + 1}", score=float(i))
    return root


def malformed_dir(root: Path) -> dict[str, str]:
    """A snapshot dir holding every kind of bad folder; returns folder -> expected reason start."""
    for i in range(1, 9):
        make_snapshot(root, i, score=float(i))
    expected = {}
    (root / "README.txt").write_text("not a snapshot")
    expected["README.txt"] = "not a directory"
    (root / "eval-abc-agent-1-ffff").mkdir()
    expected["eval-abc-agent-1-ffff"] = "unparseable folder name"
    (root / "eval-000020-agent-1-zzzz").mkdir()
    expected["eval-000020-agent-1-zzzz"] = "unparseable folder name"
    huge = make_snapshot(root, 9).rename(root / f"eval-{2**64}-agent-1-abcdef12")
    expected[huge.name] = "global index beyond a 64-bit integer"
    make_snapshot(root, 30).rename(root / os.fsdecode(b"eval-000030-agent-\xff-abcdef12"))
    expected["eval-000030-agent-\ufffd-abcdef12"] = "folder name is not UTF-8"
    f = make_snapshot(root, 21)
    (f / "metadata.json").unlink()
    expected[f.name] = "missing metadata.json"
    f = make_snapshot(root, 22)
    (f / "metadata.json").write_text("{not json")
    expected[f.name] = "invalid JSON in metadata.json"
    f = make_snapshot(root, 23)
    (f / "metadata.json").write_text("[1, 2]")
    expected[f.name] = "metadata.json is not a JSON object"
    f = make_snapshot(root, 24, with_eval_ok=False)
    expected[f.name] = "pending"
    f = make_snapshot(root, 25)
    for p in (f / "code").iterdir():
        p.unlink()
    (f / "code").rmdir()
    expected[f.name] = "missing code/"
    f = make_snapshot(root, 26)
    import shutil

    shutil.rmtree(f / "shared")
    expected[f.name] = "missing shared/"
    f = make_snapshot(root, 27)
    (f / "metadata.json").unlink()
    (f / "metadata.json").mkdir()  # exists but cannot be read as a file
    expected[f.name] = "unreadable metadata.json"
    f = make_snapshot(root, 28)
    (f / "metadata.json").write_bytes(b'{"eval_ok": true, "commit_hash": "\xff\xfe"}')
    expected[f.name] = "invalid JSON in metadata.json"
    f = make_snapshot(root, 3, agent="agent-9", commit="c" * 40)  # same index as eval-000003
    expected[f.name] = "duplicate global index 3"
    return expected


def test_every_malformed_folder_is_recorded_with_its_reason(tmp_path, data_dir):
    root = tmp_path / "all_snapshots"
    expected = malformed_dir(root)
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "out", "--task", "t", "--run-id", "m1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    skipped = {s["snapshot"]: s["skip_reason"] for s in out["skipped"]}
    assert set(skipped) == set(expected)
    for name, start in expected.items():
        assert skipped[name].startswith(start), (name, skipped[name])
    catalog = Catalog.for_log(EventLog(data_dir, "m1"))
    seen = catalog.query("select count(*) as n from stg_snapshot_seen")[0]["n"]
    assert seen == len(list(root.iterdir()))


@pytest.mark.parametrize(
    ("attempt", "problem"),
    [
        (None, "no attempt JSON matches"),
        ({"score": float("nan")}, "score is nan"),
        ({"score": float("inf")}, "score is inf"),
        ({"score": float("-inf")}, "score is -inf"),
        ({"score": True}, "score is a boolean"),
        ({"score": "0.9"}, "score is not a number"),
        ({"score": None}, "score is null"),
        ({"score": 10**400}, "score is too large for a 64-bit float"),
        ('{"score": 1' + "0" * 5000 + ', "commit_hash": "STEM"}', "attempt file "),
    ],
)
def test_attempt_problems_keep_the_candidate_without_score(tmp_path, data_dir, attempt, problem):
    root = tmp_path / "all_snapshots"
    for i in range(1, 6):
        make_snapshot(root, i, score=float(i))
    bad = make_snapshot(root, 6, score=0.0)
    attempt_file = next((bad / "shared" / "attempts").iterdir())
    if attempt is None:
        attempt_file.unlink()
    elif isinstance(attempt, str):  # raw text (json.dumps refuses an integer this long)
        attempt_file.write_text(attempt.replace("STEM", attempt_file.stem))
    else:
        attempt_file.write_text(json.dumps(attempt | {"commit_hash": attempt_file.stem}, allow_nan=True))
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o", "--task", "t", "--run-id", "a1")
    assert r.exit_code == 0, r.output
    catalog = Catalog.for_log(EventLog(data_dir, "a1"))
    row = catalog.query("select * from snapshots where global_index = 6")[0]
    assert row["skip_reason"] is None
    assert row["score"] is None and row["is_eligible"] is False and row["selected"] is False
    assert row["score_problem"].startswith(problem)
    assert row["score_for_stage"] == 5.0  # borrowed from the previous candidate


def test_attempt_lookup_by_field_and_unique_prefix(tmp_path, data_dir):
    root = tmp_path / "all_snapshots"
    commit = "1234567890abcdef" * 2 + "12345678"
    by_field = make_snapshot(
        root, 1, commit=commit, attempt_name="renamed.json", attempt={"commit_hash": commit, "score": 7.0}
    )
    by_prefix = make_snapshot(root, 2, commit="abcdef1" + "0" * 33, attempt_name="abcdef1.json", attempt={"score": 8.0})
    too_short = make_snapshot(root, 3, commit="abcdef" + "1" * 34, attempt_name="abcdef.json", attempt={"score": 9.0})
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o", "--task", "t", "--run-id", "p")
    assert r.exit_code == 0, r.output
    rows = Catalog.for_log(EventLog(data_dir, "p")).query(
        "select snapshot, score, score_problem from snapshots order by global_index"
    )
    got = {row["snapshot"]: (row["score"], row["score_problem"]) for row in rows}
    assert got[by_field.name] == (7.0, None)
    assert got[by_prefix.name] == (8.0, None)
    assert got[too_short.name][0] is None


def test_input_is_untouched_and_copies_carry_selection_fields(tmp_path, data_dir, snapshots):
    before = tree_digest(snapshots)
    out = tmp_path / "roots"
    r = invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t", "--num-roots", "6", "--json")
    assert r.exit_code == 0, r.output
    assert tree_digest(snapshots) == before
    result = json.loads(r.stdout)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p["snapshot"] for p in result["picks"])
    assert len(names) == 6
    for name in names:
        meta = json.loads((out / name / "metadata.json").read_text())
        original = json.loads((snapshots / name / "metadata.json").read_text())
        assert {k: meta[k] for k in original} == original
        assert meta["stage"] in ("early", "middle", "late")
        assert meta["selection_reason"] in ("quota", "fill")
        assert meta["score"] == float(int(name.split("-")[1]))
        assert (meta["task"], meta["direction"]) == ("t", "maximize")  # explore keeps both
        assert (out / name / "code" / "solution.py").read_bytes() == (
            snapshots / name / "code" / "solution.py"
        ).read_bytes()


def test_non_empty_out_is_refused_unless_overwrite(tmp_path, data_dir, snapshots):
    out = tmp_path / "roots"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t")
    assert r.exit_code == 1
    assert "not empty" in r.stderr and "--overwrite" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert not (data_dir / "runs").exists() or not any((data_dir / "runs").iterdir())
    # --overwrite replaces an earlier output (snapshot folders only), never other files.
    r = invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t", "--overwrite")
    assert r.exit_code == 1 and "holds 'keep.txt', not a snapshot folder" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t", "--num-roots", "3").exit_code == 0
    assert len(list(out.iterdir())) == 3
    r = invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t", "--overwrite")
    assert r.exit_code == 0, r.output
    assert len(list(out.iterdir())) == 12  # R=30 > 12 eligible: all taken
    assert "Warning: only 12 eligible snapshots for 30 roots" in r.stderr


def test_overwrite_never_replaces_the_data_directory(tmp_path, snapshots):
    data = tmp_path / "work" / "data"
    assert invoke(data, "select-snapshots", snapshots, tmp_path / "o", "--task", "t").exit_code == 0
    runs = sorted((data / "runs").iterdir())
    for out in (data, data.parent):  # the data directory, or a directory holding it
        r = invoke(data, "select-snapshots", snapshots, out, "--task", "t", "--overwrite")
        assert r.exit_code == 1 and "the output must not hold the data directory" in r.stderr
        assert sorted((data / "runs").iterdir()) == runs
    (data / "runs" / "eval-000001-agent-1-ffff").mkdir()  # looks like a snapshot, still refused
    r = invoke(data, "select-snapshots", snapshots, data / "runs", "--task", "t", "--overwrite")
    assert r.exit_code == 1 and "holds 'select-t-" in r.stderr
    assert all(run.is_dir() for run in runs)


def test_a_copy_the_os_refuses_is_a_clean_error_and_leaves_no_output(tmp_path, data_dir, snapshots):
    """A full disk or quota (here: a file-size limit) while copying the picks."""
    out, previous = tmp_path / "roots", tmp_path / "roots-before"
    assert invoke(data_dir, "select-snapshots", snapshots, out, "--task", "t", "--num-roots", "3").exit_code == 0
    before = tree_digest(out)
    (snapshots / sorted(os.listdir(snapshots))[0] / "code" / "weights.bin").write_bytes(bytes(200_000))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    for target in (out, previous):  # replacing an earlier output, and a new one
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "--data",
                str(data_dir),
                "select-snapshots",
                str(snapshots),
                str(target),
                "--task",
                "t",
                "--overwrite",
            ],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            preexec_fn=limited,
            timeout=120,
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"Error: {target}: cannot copy the picked snapshots (")
        assert "weights.bin: File too large); nothing was written there" in proc.stderr
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert tree_digest(out) == before and not previous.exists()


def test_not_a_snapshot_run_is_a_clean_error(tmp_path, data_dir):
    plain = tmp_path / "plain"
    (plain / "src").mkdir(parents=True)
    r = invoke(data_dir, "select-snapshots", plain, tmp_path / "o", "--task", "t")
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: ") and "not a snapshot run" in r.stderr
    assert "Traceback" not in r.output
    r = invoke(data_dir, "select-snapshots", tmp_path / "missing", tmp_path / "o", "--task", "t")
    assert r.exit_code == 1 and "not a directory" in r.stderr
    latin1 = tmp_path / os.fsdecode(b"caf\xe9")  # a directory name that is not UTF-8
    make_snapshot(latin1, 1)
    r = invoke(data_dir, "select-snapshots", latin1, tmp_path / "o", "--task", "t")
    assert r.exit_code == 1 and "caf\ufffd: the path is not UTF-8" in r.stderr
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
    latin1_data = tmp_path / os.fsdecode(b"d\xe9")  # DuckDB could not read a log there
    r = invoke(latin1_data, "select-snapshots", make_snapshot(tmp_path / "s", 1).parent, tmp_path / "o", "--task", "t")
    assert r.exit_code == 1 and "d\ufffd: the data directory's path is not UTF-8" in r.stderr
    assert not latin1_data.exists() and not (tmp_path / "o").exists()


def test_no_numeric_score_is_a_clean_error(tmp_path, data_dir):
    root = tmp_path / "all_snapshots"
    for i in range(1, 4):
        make_snapshot(root, i, score=None, eval_ok=False)
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o", "--task", "t", "--run-id", "z")
    assert r.exit_code == 1
    assert "numeric score" in r.stderr
    assert not EventLog(data_dir, "z").exists()
    assert not (tmp_path / "o").exists()


def test_a_number_of_roots_beyond_a_64_bit_integer_is_a_usage_error(tmp_path, data_dir, snapshots):
    r = invoke(
        data_dir,
        "select-snapshots",
        snapshots,
        tmp_path / "o",
        "--task",
        "t",
        "--run-id",
        "z",
        "--num-roots",
        str(2**70),
    )
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "Invalid value for '--num-roots'" in r.stderr and "1<=x<=9223372036854775807" in r.stderr
    assert not EventLog(data_dir, "z").exists()
    assert not (tmp_path / "o").exists()


def test_an_eval_count_beyond_a_64_bit_integer_is_left_out(tmp_path, data_dir, snapshots):
    meta_path = sorted(snapshots.glob("eval-*"))[0] / "metadata.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"eval_count": 10**30}))
    r = invoke(data_dir, "select-snapshots", snapshots, tmp_path / "o", "--task", "t", "--run-id", "e1")
    assert r.exit_code == 0, r.output
    rows = Catalog.for_log(EventLog(data_dir, "e1")).query(
        "select snapshot, eval_count from stg_snapshot_seen order by global_index"
    )
    assert rows[0]["eval_count"] is None and all(r["eval_count"] for r in rows[1:])


@pytest.mark.parametrize("task", ["..", "caf\u00e9", "a/b c", "x" * 300])
def test_any_task_name_gives_a_valid_default_run_id(tmp_path, data_dir, snapshots, task):
    r = invoke(data_dir, "select-snapshots", snapshots, tmp_path / "o", "--task", task, "--json")
    assert r.exit_code == 0, r.output
    run_id = json.loads(r.stdout)["run_id"]
    assert EventLog(data_dir, run_id).exists() and run_id.startswith("select-")
    assert Catalog.for_log(EventLog(data_dir, run_id)).query("select task from stg_run_started")[0]["task"] == task


def test_path_commands_on_a_selection_run_say_it_has_no_trees(tmp_path, data_dir, snapshots):
    assert (
        invoke(data_dir, "select-snapshots", snapshots, tmp_path / "o", "--task", "t", "--run-id", "s1").exit_code == 0
    )
    for command in ("paths", "reselect"):
        r = invoke(data_dir, command, "s1")
        assert r.exit_code == 1 and "run 's1' has no trees" in r.stderr, command


def test_direction_comes_from_the_snapshots_coral_config(tmp_path, data_dir):
    root = tmp_path / "all_snapshots"
    for i in range(1, 11):
        f = make_snapshot(root, i, score=float(10 - i))
        (f / ".coral").mkdir()
        (f / ".coral" / "config.yaml").write_text(
            "task:\n  name: x\ngrader:\n  timeout: 60\n  direction: minimize  # lower is better\n"
        )
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o", "--task", "t", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["direction"] == "minimize"
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o2", "--task", "t", "--direction", "maximize", "--json")
    assert json.loads(r.stdout)["direction"] == "maximize"


def test_the_decision_is_recorded_with_its_watermark(tmp_path, data_dir, snapshots):
    r = invoke(
        data_dir, "select-snapshots", snapshots, tmp_path / "o", "--task", "t", "--run-id", "d1", "--num-roots", "4"
    )
    assert r.exit_code == 0, r.output
    catalog = Catalog.for_log(EventLog(data_dir, "d1"))
    decision = catalog.query("select * from stg_snapshots_picked")[0]
    assert decision["watermark"] == 13  # RunStarted + 12 SnapshotSeen
    assert decision["seq"] == 14
    detail = json.loads(decision["detail"])
    assert [d["snapshot"] for d in detail if d["selected"]] == [
        row["snapshot"] for row in catalog.query("select snapshot from snapshots where selected order by global_index")
    ]
    r = invoke(data_dir, "select-snapshots", snapshots, tmp_path / "o2", "--task", "t", "--run-id", "d1")
    assert r.exit_code == 1 and "already exists" in r.stderr


def test_human_summary_lists_stages_and_skips(tmp_path, data_dir):
    root = tmp_path / "all_snapshots"
    malformed_dir(root)
    r = invoke(data_dir, "select-snapshots", root, tmp_path / "o", "--task", "t", "--num-roots", "3")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].split() == [
        "stage",
        "candidates",
        "eligible",
        "quota",
        "picked_quota",
        "fills",
        "picked",
    ]
    assert [line.split()[0] for line in lines[2:5]] == ["early", "middle", "late"]
    assert "skipped 14 folders:" in r.stdout
    assert "  README.txt: not a directory" in r.stdout
