"""--data wherever a user puts it, $TEACHER_MCTS_DATA, and hints that work as printed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from ingest.log import EventLog
from tests.conftest import ROOT, copy_run


def invoke(*args: str, **env: str):
    return CliRunner(env=env).invoke(cli, list(args))


def test_data_after_the_subcommand_works_as_before_it(runs):
    before = invoke("--data", str(runs), "paths", "rounds")
    after = invoke("paths", "rounds", "--data", str(runs))
    assert before.exit_code == 0 and after.exit_code == 0, after.output
    assert after.stdout == before.stdout and after.stdout.startswith("selection ")
    resumed = invoke("explore", "--resume", "rounds", "--data", str(runs))  # the case: "No such option"
    assert resumed.exit_code == 0 and "run rounds: finished already (4/4 trees done)" in resumed.stderr, resumed.output


def test_the_environment_variable_and_the_subcommands_data_wins(runs, tmp_path):
    assert invoke("paths", "rounds", TEACHER_MCTS_DATA=str(runs)).exit_code == 0
    nowhere = str(tmp_path / "nowhere")
    for args, env in (
        (["--data", nowhere, "paths", "rounds", "--data", str(runs)], {}),
        (["paths", "rounds", "--data", str(runs)], {"TEACHER_MCTS_DATA": nowhere}),
    ):
        r = invoke(*args, **env)
        assert r.exit_code == 0 and r.stdout.startswith("selection "), (args, r.output)
    r = invoke("paths", "rounds", TEACHER_MCTS_DATA=nowhere)
    assert r.exit_code == 1 and f"not found under {nowhere}/runs" in r.stderr, r.output


def test_every_command_takes_data_and_says_where_the_default_is():
    for name in cli.commands:
        r = invoke(name, "--help")
        assert r.exit_code == 0 and "--data" in r.stdout, name
        assert "relative to the current directory" in " ".join(r.stdout.split()), name


def run_as_printed(line: str) -> subprocess.CompletedProcess:
    """A hint's command line run as a user pastes it (in the checkout, where cli.py is)."""
    words = shlex.split(line)
    assert words[:2] == ["python", "cli.py"], line
    return subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


def hint(text: str, after: str) -> str:
    """The command line printed after ``after`` (up to the end of its line or a parenthesis)."""
    line = next(line for line in text.splitlines() if after in line)
    return line.split(after, 1)[1].split(" (", 1)[0].rstrip(")").strip()


@pytest.mark.slow
def test_the_hints_a_damaged_run_prints_work_as_printed(runs, tmp_path):
    """An all-runs command names a damaged run with the quarantine to run; it names the
    resume to run next: both carry the --data they were printed under."""
    data = tmp_path / "elsewhere"
    copy_run(runs, "rounds", data)
    copy_run(runs, "async", data)
    part = EventLog(data, "rounds").parts()[-1].path
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    part.write_bytes(bytes(raw))
    r = invoke("sql", "select 1 as one", "--data", str(data))
    assert r.exit_code == 1, r.output
    quarantine = hint(r.stderr, "move it aside (the intact prefix stays readable): ")
    assert quarantine == f"python cli.py --data {data} quarantine rounds {part.name}"
    done = run_as_printed(quarantine)
    assert done.returncode == 0 and f"moved 1 part(s) to {data}/runs/rounds/quarantine" in done.stdout, done.stderr
    resume = hint(done.stdout, "an exploration continues with: ")
    assert resume == f"python cli.py --data {data} explore --resume rounds"
    done = run_as_printed(resume)
    assert done.returncode == 0 and "run rounds: resuming task kernel-speedup" in done.stderr, done.stderr
    assert "run rounds: 4/4 trees done" in done.stdout


def test_a_run_not_found_names_the_absolute_place_and_how_to_look_elsewhere(tmp_path, monkeypatch):
    """From another directory, "not found under data/runs" named a relative place, and no way out."""
    monkeypatch.chdir(tmp_path)
    r = invoke("paths", "rounds")
    assert r.exit_code == 1, r.output
    assert r.stderr == (
        f"Error: run 'rounds' not found under {tmp_path}/data/runs (the data dir is --data DIR, "
        "$TEACHER_MCTS_DATA or ./data)\n"
    )
    (tmp_path / "data" / "runs").mkdir(parents=True)
    r = invoke("replay")
    assert r.exit_code == 1 and f"no runs under {tmp_path}/data/runs (the data dir is --data" in r.stderr, r.output
    r = invoke("audit", "nocampaign")
    assert r.exit_code == 1 and "--data DIR" in r.stderr, r.output


@pytest.mark.slow
def test_hints_begin_as_the_command_was_typed_and_work_pasted_where_it_was_typed(runs, tmp_path):
    """Run as `teacher-mcts` or as `python <a path to cli.py>` from another directory, a hint begins
    the same way, so that pasting it where the command was typed runs it (it said `python cli.py`,
    which fails there: exit 2)."""
    work = tmp_path / "work"
    copy_run(runs, "rounds", work / "data")
    part = EventLog(work / "data", "rounds").parts()[-1].path
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    part.write_bytes(bytes(raw))
    scripts = Path(sys.executable).parent  # where `pip install -e .` put teacher-mcts (and this python)
    env = os.environ | {"PATH": f"{scripts}{os.pathsep}{os.environ['PATH']}"}
    typed = os.path.relpath(ROOT / "cli.py", work)
    quarantine = "quarantine rounds " + part.name

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(line, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=600)

    found = run("teacher-mcts sql 'select 1 as one'")
    assert found.returncode == 1, found.stderr
    assert hint(found.stderr, "move it aside (the intact prefix stays readable): ") == f"teacher-mcts {quarantine}"
    found = run(f"python {typed} sql 'select 1 as one'")
    line = hint(found.stderr, "move it aside (the intact prefix stays readable): ")
    assert line == f"python {typed} {quarantine}" and typed.startswith("..")
    done = run(line)  # pasted where the command was typed
    assert done.returncode == 0 and "moved 1 part(s)" in done.stdout, done.stderr
