"""The live engine end to end: determinism, kill -9 and resume, async mode, CLI errors."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_run, make_snapshot
from soundness import assert_log_is_sound, logical_log, tree_shape

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog

SMALL = """
[tree]
target_good_leaves = 4
"""


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    """Four roots selected from the bundled Student run."""
    base = tmp_path_factory.mktemp("roots")
    out = base / "roots"
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(base / "data"),
            "select-snapshots",
            str(ROOT / "data" / "student_run" / "all_snapshots"),
            str(out),
            "--task",
            "kernel-speedup",
            "--num-roots",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def small_config(tmp_path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def explore(data_dir: Path, *args: object):
    r = CliRunner().invoke(cli, ["--data", str(data_dir), "explore", *map(str, args)])
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [1, 8])
def test_rounds_mode_is_reproducible(tmp_path, roots, small_config, parallel):
    data = tmp_path / "data"
    for run in ("a", "b"):
        explore(data, roots, "--run-id", run, "--parallel", parallel, "--seed", 7, "--config", small_config)
    a, b = logical_log(data, "a"), logical_log(data, "b")
    assert len(a) > 500
    assert a == b
    # The seed matters: another seed grows other trees.
    explore(data, roots, "--run-id", "c", "--parallel", parallel, "--seed", 8, "--config", small_config)
    assert tree_shape(data, "c") != tree_shape(data, "a")


def run_until_killed(
    data_dir: Path, args: list[str], kill_after_seq: int, sig: int = signal.SIGKILL
) -> tuple[int, str]:
    """Run ``explore`` until its log reaches a seq, then send ``sig``: (exit code, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data_dir), "explore", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log = EventLog(
        data_dir, args[args.index("--run-id") + 1] if "--run-id" in args else args[args.index("--resume") + 1]
    )
    try:
        while proc.poll() is None:
            if log.exists() and log.tail_seq() >= kill_after_seq:
                proc.send_signal(sig)
                break
            time.sleep(0.02)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err.decode()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "sig"),
    [("rounds", signal.SIGKILL), ("async", signal.SIGKILL), ("rounds", signal.SIGTERM)],
    ids=["rounds-SIGKILL", "async-SIGKILL", "rounds-SIGTERM"],
)
def test_kill_then_resume_completes_without_losing_or_repeating_turns(tmp_path, roots, small_config, schedule, sig):
    data = tmp_path / "data"
    common = ["--parallel", "4", "--seed", "3", "--schedule", schedule, "--config", str(small_config)]
    explore(data, roots, "--run-id", "whole", *common)
    total = EventLog(data, "whole").tail_seq()
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    first, second = sorted(rng.sample(range(total // 10, 9 * total // 10), 2))
    code, err = run_until_killed(data, [str(roots), "--run-id", "cut", *common], first, sig)
    assert EventLog(data, "cut").tail_seq() < total, f"seed {seed}: the run was not interrupted"
    if sig == signal.SIGTERM:  # unwound like Ctrl-C: a message, 128 + 15, no traceback
        assert code == 143 and err.rstrip().endswith("Terminated by SIGTERM."), (code, err)
    run_until_killed(data, ["--resume", "cut"], second, sig)
    explore(data, "--resume", "cut")
    assert_log_is_sound(data, "cut")
    resumed = Catalog.for_log(EventLog(data, "cut")).query("select count(*) as n from stg_run_resumed")
    assert resumed[0]["n"] >= 1
    if schedule == "rounds":
        assert tree_shape(data, "cut") == tree_shape(data, "whole"), f"kill seed {seed}"


@pytest.mark.slow
def test_a_full_disk_stops_the_run_cleanly_and_resume_goes_on(tmp_path, roots, small_config):
    """A write the OS refuses (here: a file-size limit, as a full disk or quota would)."""
    data = tmp_path / "data"
    limit = 30_000  # bytes: small parts fit, a merged one does not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(roots),
            "--run-id",
            "full",
            "--parallel",
            "4",
            "--config",
            str(small_config),
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=300,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    error = re.search(
        r"^Error: (\S+\.parquet): cannot write this part of the log \(File too large\); "
        r"the log is intact up to seq (\d+)$",
        proc.stderr,
        re.MULTILINE,
    )
    assert error, proc.stderr
    log = EventLog(data, "full")
    assert not Path(error[1]).exists() and log.tail_seq() == int(error[2])
    assert not [f for f in os.listdir(log.log_dir) if f.startswith(".tmp-")]
    explore(data, "--resume", "full")
    assert_log_is_sound(data, "full")
    assert CliRunner().invoke(cli, ["--data", str(data), "replay", "full"]).exit_code == 0


def test_a_spool_write_the_os_refuses_keeps_the_run_going(tmp_path):
    """The spool only spares re-running a turn after a kill: a refused write is skipped."""
    code = """
import resource, sys
from pathlib import Path
from engine.mcts.spool import Spool
from ingest.events import ToolCalled
spool = Spool(Path(sys.argv[1]))
calls = [ToolCalled(tree_id="T1", edge_id="T1/e1-1", turn=1, step=1, call_id=f"c{i}", tool="bash",
                    status="ok", target="x" * 200) for i in range(100)]
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
spool.put("T1/e1-1", 1, calls)  # 20 kB: refused
spool.put("T1/e1-2", 1, calls[:1])
print(spool.take("T1/e1-1", 1) is None, len(spool.take("T1/e1-2", 1)), sorted(p.name for p in spool.dir.iterdir()))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    kept, taken, names = proc.stdout.split(" ", 2)
    assert (kept, taken) == ("True", "1") and re.fullmatch(r"\['T1~e1-2--t1-[0-9a-f]{32}\.arrow'\]\n", names), names


def test_a_spool_file_damaged_or_torn_is_dropped_and_its_turn_runs_again(tmp_path):
    from engine.mcts.spool import Spool
    from ingest.events import ToolCalled

    spool = Spool(tmp_path)
    calls = [
        ToolCalled(
            tree_id="T1",
            edge_id="T1/e1-1",
            turn=1,
            step=1,
            call_id=f"c{i}",
            tool="bash",
            status="ok",
            target=f"echo {i}",
        )
        for i in range(20)
    ]
    spool.put("T1/e1-1", 1, calls)
    assert spool.take("T1/e1-1", 1) == calls
    (path,) = spool.dir.iterdir()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x20  # a value changed: the file still parses as Arrow
    path.write_bytes(bytes(raw))
    assert spool.take("T1/e1-1", 1) is None and not path.exists()
    spool.put("T1/e1-1", 1, calls)
    (path,) = spool.dir.iterdir()
    path.write_bytes(path.read_bytes()[:100])  # torn
    assert spool.take("T1/e1-1", 1) is None and not list(spool.dir.iterdir())


def test_a_spool_file_of_another_run_or_another_start_is_dropped_and_said(tmp_path):
    from engine.mcts.spool import Spool
    from ingest.events import ToolCalled

    calls = [ToolCalled(tree_id="T1", edge_id="T1/e1-1", turn=1, step=1, call_id="c", tool="bash", status="ok")]
    Spool(tmp_path, identity="run-b").put("T1/e1-1", 1, calls, start="s1")  # another run of the same id
    spool = Spool(tmp_path, identity="run-a")
    assert spool.take("T1/e1-1", 1, start="s1") is None and not list(spool.dir.iterdir())
    spool.put("T1/e1-1", 1, calls, start="s1")
    assert spool.take("T1/e1-1", 1, start="s2") is None  # kept for another start: stale
    spool.put("T1/e1-1", 1, calls, start="s1")
    assert spool.take("T1/e1-1", 1, start="s1") == calls
    dropped = spool.drained()
    assert [(d.edge_id, d.turn, d.tree_id) for d in dropped] == [("T1/e1-1", 1, "T1")] * 2
    assert "another run" in dropped[0].reason and "another start state" in dropped[1].reason
    assert spool.drained() == []


def test_async_mode_completes_with_every_edge_judged(runs):
    out = json.loads(CliRunner().invoke(cli, ["--data", str(runs), "replay", "async", "--json"]).stdout)
    assert [t["status"] for t in out["trees"]] == ["done"] * 4
    assert_log_is_sound(runs, "async")


@pytest.mark.slow
def test_any_64_bit_count_in_the_config_works(tmp_path, roots):
    """The validator accepts every count that fits 64 bits, so the views must too."""
    big = 2**63 - 1
    data = tmp_path / "data"
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(data),
            "select-snapshots",
            str(ROOT / "data" / "student_run" / "all_snapshots"),
            str(tmp_path / "all"),
            "--task",
            "k",
            "--num-roots",
            str(big),
            "--run-id",
            "all",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    catalog = Catalog.for_log(EventLog(data, "all"))
    counts = catalog.query(
        "select count(*) filter (where selected) as n, count(*) filter (where eval_ok) as ok from snapshots"
    )[0]
    assert counts["n"] == counts["ok"] == len(json.loads(r.stdout)["picks"])  # R beyond them: all picked
    config = tmp_path / "big.toml"
    config.write_text(
        f"[tree]\nmax_children = {big}\nmax_depth = {big}\nhard_token_limit = {big}\n"
        f"target_good_leaves = {big}\nmax_failed_expansions = {big}\nmax_valid_edges = 12\n"
        f"[paths]\ntop_k = {big}\n"
    )
    explore(data, roots, "--config", config, "--run-id", "big", "--parallel", "8")
    catalog = Catalog.for_log(EventLog(data, "big"))
    trees = catalog.query("select stop_reason, kept_edges from trees")
    assert len(trees) == 4
    assert {t["stop_reason"] for t in trees} == {"max_edges"} and all(t["kept_edges"] > 12 for t in trees)
    paths = catalog.query("select count(*) filter (where selected) as s, count(rank) as n from paths")[0]
    assert paths["s"] == paths["n"] > 0  # k beyond the paths: every ranked path is selected
    r = CliRunner().invoke(cli, ["--data", str(data), "replay", "big"])
    assert r.exit_code == 0 and "0 differ" in r.stdout, r.output


ONE_EDGE = "[tree]\nroot_children = 1\nmax_depth = 1\n"


@pytest.mark.slow
def test_explore_records_the_whole_config_the_roots_and_their_task(tmp_path, roots):
    """ROOTS made by select-snapshots: the task recorded with them is the run's (it used to
    be the directory's name), and each root keeps its stage and reason."""
    data = tmp_path / "data"
    config = tmp_path / "one.toml"
    config.write_text(ONE_EDGE)
    r = explore(data, roots, "--run-id", "cfg", "--seed", 11, "--config", config)
    cat = Catalog.for_log(EventLog(data, "cfg"))
    config = json.loads(cat.query("select config from stg_run_started")[0]["config"])
    assert config["seed"] == 11 and config["tree"]["max_depth"] == 1 and config["task"] == "kernel-speedup"
    assert config["tree"]["alpha"] == 0.5 and config["soft"]["outcome"] == 0.3
    assert config["knowledge"]["command_regex"] and config["schedule"] == "rounds"  # the sim's default
    roots_added = cat.query("select tree_id, task, stage, selection_reason from stg_root_added order by 1")
    assert [r["tree_id"] for r in roots_added] == ["T001", "T002", "T003", "T004"]
    assert all(r["stage"] and r["selection_reason"] and r["task"] == "kernel-speedup" for r in roots_added)
    assert {t["task"] for t in json.loads(explore(data, "--resume", "cfg", "--json").stdout)["trees"]} == {
        "kernel-speedup"
    }
    assert "Top-6: " in r.stdout
    # Every decision names the seq of the last event it saw, which precedes it.
    table = EventLog(data, "cfg").read_table(["seq", "watermark"])
    mask = pc.is_valid(table.column("watermark"))
    decided = table.filter(mask)
    assert decided.num_rows > 0
    assert all(
        w < s for s, w in zip(decided.column("seq").to_pylist(), decided.column("watermark").to_pylist(), strict=True)
    )


def test_a_task_that_disagrees_with_the_roots_or_is_missing_is_refused(tmp_path, roots):
    data = tmp_path / "data"
    r = CliRunner().invoke(cli, ["--data", str(data), "explore", str(roots), "--task", "other"])
    assert r.exit_code == 1 and "--task 'other' disagrees with the task 'kernel-speedup'" in r.stderr
    handmade = tmp_path / "handmade"
    make_snapshot(handmade, 1)
    r = CliRunner().invoke(cli, ["--data", str(data), "explore", str(handmade)])
    assert r.exit_code == 1 and "the roots record no task" in r.stderr and "--task" in r.stderr
    assert not (data / "runs").exists()
    meta = json.loads(next(roots.iterdir()).joinpath("metadata.json").read_text())
    assert meta["task"] == "kernel-speedup" and meta["selection_run"]


def test_resume_of_a_finished_run_only_reports(tmp_path, runs):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data, "done")
    before = EventLog(data, "done").tail_seq()
    spool = EventLog(data, "done").dir / "spool"  # as a kill after the last part, before its removal, leaves it
    spool.mkdir()
    (spool / "T001~e1-1--t1.arrow").write_bytes(b"a turn the log holds")
    r = explore(data, "--resume", "done")
    assert "4/4 trees done" in r.stdout and r.stderr.startswith("run done: finished already (4/4 trees done)")
    assert EventLog(data, "done").tail_seq() == before
    assert not spool.exists()


def test_the_summary_names_each_quantity_once_and_its_counts_agree(tmp_path, runs):
    """The summary line, the table and the JSON trees: one name per quantity (kept_edges
    includes the exempt ones), and the line's totals are the table's sums."""
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    out = json.loads(explore(data, "--resume", "rounds", "--json").stdout)
    tree = out["trees"][0]
    assert not {"edges_kept", "edges_kept_exempt", "stop_condition", "in_flight"} & set(tree)
    assert {
        "kept_edges",
        "kept_exempt_edges",
        "pruned_edges",
        "retried_edges",
        "paths",
        "ranked",
        "selected",
        "top_path_score",
        "stop_reason",
        "status",
    } <= set(tree)
    for t in out["trees"]:
        assert t["kept_edges"] == t["nodes"] - 1 and t["kept_exempt_edges"] <= t["kept_edges"]
    for key in ("kept_edges", "kept_exempt_edges", "pruned_edges", "retried_edges"):
        assert out["progress"][key] == sum(t[key] for t in out["trees"]), key
    text = explore(data, "--resume", "rounds").stdout.splitlines()
    p = out["progress"]
    line = (
        f"edges kept {p['kept_edges']} ({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, "
        f"retried {p['retried_edges']}; leaves {p['leaves']}"
    )
    assert text[0].endswith(line)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/roots", "--task", "k"], "not a directory"),
        (["--resume", "nope"], "run 'nope' not found"),
        (["{roots}", "--config", "{bad}"], "invalid configuration"),
        (["{roots}", "--config", "{toml}"], "invalid TOML"),
        (["{roots}", "--config", "{regex}"], "knowledge.path_regex: Value error, not a"),
        (["{roots}", "--config", "{nan}"], "paths.max: Input should be a finite number"),
        (["{roots}", "--config", "{sim}"], "sim backend options: token_growth: Input should"),
        (["{roots}", "--config", "{wide}"], "tree.root_children: Input should be less than or equal"),
    ],
)
def test_explore_errors_are_clean(tmp_path, roots, args, message):
    bad = tmp_path / "bad.toml"
    bad.write_text("[tree]\nmax_depth = 0\n")
    toml = tmp_path / "broken.toml"
    toml.write_text("[tree\n")
    regex = tmp_path / "regex.toml"
    regex.write_text('[knowledge]\npath_regex = "(["\n')
    nan = tmp_path / "nan.toml"
    nan.write_text("[paths]\nmax = nan\n")
    sim = tmp_path / "sim.toml"
    sim.write_text('[backend_options]\ntoken_growth = "x"\n')
    wide = tmp_path / "wide.toml"
    wide.write_text("[tree]\nroot_children = 1000000\n")
    args = [a.format(roots=roots, bad=bad, toml=toml, regex=regex, nan=nan, sim=sim, wide=wide) for a in args]
    r = CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "explore", *args])
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("Error: ") and message in r.stderr
    assert "Traceback" not in r.output
    assert not (tmp_path / "data" / "runs").exists() or not any((tmp_path / "data" / "runs").iterdir())


def test_explore_usage_errors(tmp_path, roots):
    r = CliRunner().invoke(cli, ["--data", str(tmp_path), "explore", str(roots), "--select"])
    assert r.exit_code == 2 and "--select: needs --task" in r.stderr
    r = CliRunner().invoke(cli, ["--data", str(tmp_path), "explore"])
    assert r.exit_code == 2 and "ROOTS: is required (or --resume RUN_ID)" in r.stderr
    r = CliRunner().invoke(cli, ["--data", str(tmp_path), "explore", str(roots), "--seed", str(2**70)])
    assert r.exit_code == 2 and "Invalid value for '--seed'" in r.stderr
