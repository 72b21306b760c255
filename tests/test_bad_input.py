"""Bad input and first-day traps: each is refused up front with a clean error and the right exit code.

The rule (docs/COMMANDS.md, exit codes): a command-line option's value that no run could use is
a usage error (exit 2); bad content of files and logs is exit 1. Nothing is left behind.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, SNAPSHOTS

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog


def invoke(data: Path, *args: object):
    return CliRunner().invoke(cli, ["--data", str(data), *map(str, args)])


def no_runs(data: Path) -> bool:
    return not (data / "runs").exists() or not any((data / "runs").iterdir())


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    """A select-snapshots output of 3 roots (its run in a data dir of its own)."""
    out = tmp_path / "roots"
    r = invoke(tmp_path / "sel", "select-snapshots", SNAPSHOTS, out, "--task", "kernel-speedup", "--num-roots", 3)
    assert r.exit_code == 0, r.output
    return out


# ------------------------------------------------------------ 9: verify's exit


@pytest.mark.slow
def test_verify_exits_0_every_time(runs):
    """`verify` printed its result and then, 1 run in 5 to 40 on a loaded machine, died with
    exit 134 ("terminate called without an active exception"): a thread of pyarrow's pool
    dropping a Python buffer while the interpreter was torn down. 40 processes, two at a time
    (the load makes the race likelier; here the old code failed ~1 in 240 such runs)."""

    def once(_i: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "--data", str(runs), "verify", "rounds"],
            capture_output=True,
            text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(once, range(40)))
    failed = [(r.returncode, r.stderr[-300:]) for r in results if r.returncode != 0]
    assert failed == []
    assert all(
        r.stdout.splitlines()[-1].startswith("verify: ") and "every checksum matches" in r.stdout for r in results
    )


def test_a_command_run_as_a_script_ends_with_its_exit_code_and_all_its_output(runs, tmp_path):
    """The process ends without the interpreter's teardown: stdout flushed whole, codes kept."""
    script = [sys.executable, str(ROOT / "cli.py"), "--data", str(runs)]
    big = subprocess.run(
        [*script, "sql", "rounds", "select * from tool_calls", "--csv"], capture_output=True, text=True, timeout=300
    )
    assert big.returncode == 0 and big.stderr == ""
    count = invoke(runs, "sql", "rounds", "select count(*) as n from tool_calls", "--json")
    assert len(big.stdout.splitlines()) == json.loads(count.stdout)[0]["n"] + 1  # every row, and the header
    missing = subprocess.run([*script, "verify", "nope"], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and missing.stderr.startswith("Error: run 'nope' not found")
    usage = subprocess.run([*script, "verify"], capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and "Missing argument 'RUN_ID'" in usage.stderr


# ------------------------------------------------------- 11: a config not UTF-8


def test_a_config_file_that_is_not_utf8_is_a_clean_error_naming_it(tmp_path):
    config = tmp_path / "utf16.toml"
    config.write_bytes("parallel = 3\n".encode("utf-16"))  # with a BOM, as some editors save
    data = tmp_path / "data"
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "k", "--config", config)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"Error: {config}: not UTF-8 text") and "Traceback" not in r.output
    assert no_runs(data)


# ------------------------------------------------------ 12: --parallel capped


def test_a_parallel_beyond_the_cap_is_refused_up_front(tmp_path):
    """--parallel 100000 ran ~34 s, then failed with "can't start new thread"."""
    data = tmp_path / "data"
    started = time.monotonic()
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "k", "--parallel", 100000)
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--parallel': 100000 is above the cap of 4096: each slot is a thread" in r.stderr
    config = tmp_path / "wide.toml"
    config.write_text("parallel = 100000\n")
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "k", "--config", config)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"Error: {config}: invalid configuration (parallel: 100000 is above the cap")
    assert time.monotonic() - started < 60 and no_runs(data)  # refused before anything ran


def start_explore(data: Path, run_id: str, body: str, *args: object) -> subprocess.Popen:
    config = data.parent / f"{run_id}.toml"
    config.write_text(body)
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
            *map(str, args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_parts(log: EventLog, proc: subprocess.Popen, parts: int = 2, deadline: float = 300) -> None:
    end = time.monotonic() + deadline
    while not (log.log_dir.is_dir() and len(list(log.log_dir.glob("part-*.parquet"))) >= parts):
        assert proc.poll() is None and time.monotonic() < end, "the run did not get going"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_recorded_with_too_many_slots_resumes_with_fewer(tmp_path):
    """A run recorded with a parallel above this machine's cap (here: a lower ulimit -u at the
    resume) is refused with the way out, and `--resume RUN --parallel 8` continues it; the
    RunResumed event says what ran, and replay re-derives every decision as before."""
    data = tmp_path / "data"
    proc = start_explore(
        data, "big", "[tree]\ntarget_good_leaves = 4\n[backend_options]\nlatency_s = 0.2\n", "--parallel", 64
    )
    try:
        wait_for_parts(EventLog(data, "big"), proc)
    finally:
        proc.kill()
        proc.wait()
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (100, hard))  # a cap of 50 (root is not held to it)
    try:
        refused = invoke(data, "explore", "--resume", "big")
        timeout = invoke(data, "explore", "--resume", "big", "--parallel", 8, "--turn-timeout", 60)
        resumed = invoke(data, "explore", "--resume", "big", "--parallel", 8)
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    assert (
        refused.exit_code == 1
        and refused.stderr.startswith(
            "Error: run 'big': its recorded parallel 64 is above the cap of 50: each slot is a thread"
        )
        and "ulimit -u" in refused.stderr
        and "resume it with a smaller --parallel" in refused.stderr
    )
    assert timeout.exit_code == 2 and "--turn-timeout: run 'big' uses the sim backend" in timeout.stderr
    assert resumed.exit_code == 0, resumed.output
    catalog = Catalog.for_log(EventLog(data, "big"))
    notes = [r["note"] for r in catalog.query("select note from stg_run_resumed order by seq")]
    assert notes == ["resumed from the log; parallel 8 (recorded 64)"]
    assert catalog.query("select count(*) as n from stg_run_finished")[0]["n"] == 1
    replay = invoke(data, "replay", "big")
    assert replay.exit_code == 0 and replay.stdout.splitlines()[-1].endswith(" 0 differ")


# ---------------------------------------------- 13: what --resume may change


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--seed", "3"], "--seed"),
        (["--backend", "opencode"], "--backend"),
        (["--schedule", "async"], "--schedule"),
        (["--config", "/no/such.toml"], "--config"),
        (["--parallel", "2", "--seed", "1"], "--seed"),
        (["--model", "a/b", "--task", "t"], "--model, --task"),
    ],
)
def test_resume_refuses_the_options_a_run_keeps(runs, tmp_path, args, named):
    """They were silently ignored (an invalid --config too): the run went on with its own."""
    from conftest import copy_run

    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    before = EventLog(data, "rounds").tail_seq()
    r = invoke(data, "explore", "--resume", "rounds", *args)
    assert r.exit_code == 2, r.output
    assert (
        f"Error: --resume: continues the run as its log records it: {named} cannot change (the run "
        "keeps its recorded value); a resume may change only --parallel, --turn-timeout, --executor" in r.stderr
    )
    assert EventLog(data, "rounds").tail_seq() == before
    assert invoke(data, "explore", "--resume", "rounds", "--parallel", 2).exit_code == 0  # finished: summarized


# ------------------------------------------ 14: numeric backend options bounded


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("latency_s = 1e308", "latency_s: Input should be less than or equal to 86400"),
        ("latency_s = -1", "latency_s: Input should be greater than or equal to 0"),
        ("null_eval_rate = 1e308", "null_eval_rate: Input should be less than or equal to 1"),
        ("base_context = 1e13", "base_context: Input should be less than or equal"),
        ("token_growth = [0, 1e300]", "token_growth.1: Unable to parse input string as an integer"),
        ("calls_per_step = [1, 5000]", "calls_per_step must be [low, high] with 0 <= low <= high <= 1000"),
    ],
)
def test_numeric_sim_options_out_of_range_are_refused_before_the_run_exists(tmp_path, body, problem):
    """latency_s = 1e308 passed, and then every turn (and every resume) failed with OverflowError."""
    config = tmp_path / "sim.toml"
    config.write_text(f"[backend_options]\n{body}\n")
    data = tmp_path / "data"
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "k", "--config", config)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("Error: sim backend options: ") and problem in r.stderr
    assert no_runs(data)


# ------------------------------------------------ 15: a root's metadata.json


def edit_meta(folder: Path, **changes: object) -> None:
    path = folder / "metadata.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"stage": ["early"]}, 'stage in metadata.json is ["early"], not text'),
        ({"stage": "nearly"}, "stage in metadata.json is 'nearly', not one of early, middle, late"),
        ({"task": 7}, "task in metadata.json is 7, not text"),
        ({"eval_ok": "yes"}, 'eval_ok is "yes", not JSON true'),
        ({"eval_ok": 1}, "eval_ok is 1, not JSON true"),
        ({"eval_ok": False}, "eval_ok is false, not JSON true"),
    ],
)
def test_a_root_whose_metadata_is_not_what_select_snapshots_writes_is_refused(roots, tmp_path, changes, problem):
    """A list-valued stage silently became null and eval_ok "yes" was taken as an eligible root."""
    folder = sorted(roots.iterdir())[1]
    edit_meta(folder, **changes)
    data = tmp_path / "data"
    r = invoke(data, "explore", roots)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"Error: {roots}: cannot use every folder as a root: {folder.name}: {problem}")
    assert no_runs(data)


# --------------------------------------------------- 16: one exit-code rule


@pytest.mark.parametrize(
    "args",
    [
        ["reselect", "rounds", "--top-k", "0"],
        ["reselect", "rounds", "--diversity", "nan"],
        ["reselect", "rounds", "--weights", "max=abc"],
        ["reselect", "rounds", "--weights", "max=0,avg=0,clean=0,know=0"],
        ["explore", str(SNAPSHOTS), "--select", "--task", "k", "--parallel", "0"],
        ["explore", str(SNAPSHOTS), "--select", "--task", "k", "--seed", str(2**63)],
        ["explore", str(SNAPSHOTS), "--select", "--task", "k", "--turn-timeout", "nan"],
        ["explore", str(SNAPSHOTS), "--select", "--task", "k", "--run-id", "a/b"],
        ["select-snapshots", str(SNAPSHOTS), "{out}", "--task", ""],
        ["select-snapshots", str(SNAPSHOTS), "{out}", "--task", "k", "--run-id", "../x"],
        ["select-snapshots", str(SNAPSHOTS), "{out}", "--task", "k", "--num-roots", "0"],
        ["watch", "rounds", "--period", "nan"],
        ["watch", "rounds", "--period", "inf"],
        ["export", "rounds", "--out", "{out}", "--workspace", "workspace"],
        ["audit", "rounds", "--by", "colour"],
    ],
)
def test_a_bad_option_value_is_a_usage_error(runs, tmp_path, args):
    """`--top-k 0`, `--diversity nan` and `--weights max=abc` exited 1, `--parallel 0` 2."""
    from conftest import copy_run

    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    before = EventLog(data, "rounds").tail_seq()
    r = invoke(data, *[a.format(out=tmp_path / "out") for a in args])
    assert r.exit_code == 2, r.output
    assert "Usage: " in r.stderr and "Error: " in r.stderr and "Traceback" not in r.output
    assert EventLog(data, "rounds").tail_seq() == before and not (tmp_path / "out").exists()
    assert [p.name for p in (data / "runs").iterdir()] == ["rounds"]


def test_bad_content_of_a_file_is_exit_1(tmp_path):
    """The same value in a config file is bad content, not usage."""
    config = tmp_path / "zero.toml"
    config.write_text("parallel = 0\n")
    r = invoke(tmp_path / "data", "explore", SNAPSHOTS, "--select", "--task", "k", "--config", config)
    assert r.exit_code == 1 and r.stderr.startswith(f"Error: {config}: invalid configuration (parallel: ")


# ------------------------------------------- 17: a failed select-snapshots


def test_a_select_snapshots_that_cannot_write_out_leaves_no_run(tmp_path):
    """It recorded the run first: every all-runs command then showed "0 trees, 1 decisions"."""
    data = tmp_path / "data"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = invoke(data, "select-snapshots", SNAPSHOTS, blocker / "out", "--task", "k")
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"Error: {blocker / 'out'}: cannot copy the picked snapshots (")
    assert "no run was recorded" in r.stderr
    assert no_runs(data)
    assert invoke(data, "replay").stderr.startswith("Error: no runs under")


def test_a_selection_whose_run_cannot_be_recorded_puts_the_earlier_output_back(tmp_path):
    """The copies are in place before the run is recorded; if recording fails they are taken back."""
    out = tmp_path / "out"
    first = invoke(
        tmp_path / "data", "select-snapshots", SNAPSHOTS, out, "--task", "k", "--num-roots", 3, "--run-id", "first"
    )
    assert first.exit_code == 0, first.output
    before = sorted(p.name for p in out.iterdir())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "runs").write_text("")  # where the run would go: no run can be created there
    r = invoke(broken, "select-snapshots", SNAPSHOTS, out, "--task", "k", "--num-roots", 5, "--overwrite")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == before
    assert {json.loads((p / "metadata.json").read_text())["selection_run"] for p in out.iterdir()} == {"first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "data", "out"]  # no staging left
