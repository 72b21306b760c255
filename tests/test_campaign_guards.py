"""Issue 33, findings 7 and 9: no output lands on a log, a record or derived state; a campaign's
tasks differ in more than case; `verify` and `quarantine` take a campaign's name, so every hint
that names them works as printed. One small campaign (two tasks of two roots), built once and
copied by each test that changes it."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from ingest.log import EventLog
from tests.conftest import ROOT

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
CAMPAIGN = f"""policy = "fixed"
parallel = 2
[explore]
backend = "sim"
parallel = 2
selection = {{ num_roots = 2 }}
tree = {{ max_valid_edges = 3 }}
[[tasks]]
name = "a"
source = "{SNAPSHOTS}"
[[tasks]]
name = "b"
source = "{SNAPSHOTS}"
"""


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


def run_as_printed(line: str):
    """A hint's command line run as printed: ``python cli.py [--data DIR] WORDS``."""
    words = shlex.split(line)
    assert words[:2] == ["python", "cli.py"], line
    return CliRunner().invoke(cli, words[2:])


def hint(text: str, after: str, end: str = " (") -> str:
    """The command line printed after ``after`` (up to ``end``, a quote or the end of its line)."""
    line = next(line for line in text.splitlines() if after in line)
    return line.split(after, 1)[1].split(end, 1)[0].rstrip(")").strip()


def hashes(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A data dir with the finished campaign ``camp``: its log and its runs ``camp-a`` and ``camp-b``."""
    base = tmp_path_factory.mktemp("campaign")
    (base / "camp.toml").write_text(CAMPAIGN)
    r = invoke(base / "data", "campaign", str(base / "camp.toml"))
    assert r.exit_code == 0, r.output
    return base / "data"


@pytest.fixture
def data(built, tmp_path) -> Path:
    """A copy of the campaign's data dir, to change."""
    copy = tmp_path / "data"
    shutil.copytree(built, copy)
    return copy


def campaign_part(data: Path, index: int = -1) -> Path:
    return sorted((data / "campaigns" / "runs" / "camp" / "log").glob("part-*.parquet"))[index]


# ------------------------------------------------------------------ outputs never land on a log


@pytest.mark.slow
def test_no_output_lands_on_a_log_a_record_or_derived_state(data, tmp_path):
    """Finding 7: `report --out <data>/campaigns/runs/<name>/log/_record.jsonl` overwrote the campaign's record."""
    record = data / "campaigns" / "runs" / "camp" / "log" / "_record.jsonl"
    derived = next((data / "derived").iterdir())
    (tmp_path / "into-runs").symlink_to(data / "runs" / "camp-a" / "log")
    (tmp_path / "linked-data").symlink_to(data)
    refused = {
        # target: what it would overwrite
        record: "the campaigns of the data directory",
        record.parent / "new.html": "the campaigns of the data directory",
        data / "campaigns": "the campaigns of the data directory",
        derived / "r.html": "the derived state of the data directory",
        data / "derived": "the derived state of the data directory",
        tmp_path / "into-runs" / "r.html": "the runs of the data directory",  # a link elsewhere, pointing in
        data / "out" / ".." / "campaigns" / "r.html": "the campaigns of the data directory",
        tmp_path / "linked-data" / "derived" / "r.html": "the derived state of the data directory",
        data: "the runs of the data directory",  # holds them all
    }
    before = hashes(data)
    for target, held in refused.items():
        for command in (
            ["report", "camp", "--out", str(target)],
            ["export", "camp", "--out", str(target)],
            ["sql", "camp", "select 1 as x", "--parquet", str(target), "--overwrite"],
        ):
            if command[0] != "export" and target.is_dir():
                continue  # a file's option: click refuses a directory first (exit 2)
            for data_dir in (data, tmp_path / "linked-data"):  # a --data that is itself a link
                r = invoke(data_dir, *command)
                assert r.exit_code == 1 and "Traceback" not in r.output, (command, r.output)
                assert r.stderr.startswith(f"Error: {target}: lies among or holds {held}"), (command, r.stderr)
                assert "nothing was written" in r.stderr
    assert hashes(data) == before
    (data / "out").mkdir()
    assert invoke(data, "report", "camp", "--out", str(data / "out" / "r.html")).exit_code == 0  # README's data/out
    assert invoke(data, "export", "camp", "--out", str(data / "out" / "train")).exit_code == 0


def test_the_guard_knows_where_derived_state_lives():
    from engine.derived.keys import DERIVED
    from ingest.paths import CAMPAIGNS, GUARDED, campaigns_dir
    from ingest.paths import DERIVED as GUARDED_DERIVED

    assert DERIVED == GUARDED_DERIVED and campaigns_dir("d") == Path("d", CAMPAIGNS)
    assert set(GUARDED) == {"runs", CAMPAIGNS, DERIVED}


# ------------------------------------------------------------------ task names ignoring case


def test_tasks_whose_names_differ_only_in_case_are_refused_before_anything_is_written(tmp_path):
    """Finding 9: tasks `a` and `A` were accepted; their runs clash on a case-insensitive file system."""
    path = tmp_path / "clash.toml"
    path.write_text(CAMPAIGN.replace('name = "b"', 'name = "A"'))
    r = invoke(tmp_path / "data", "campaign", str(path))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith(f"Error: {path}: invalid campaign")
    assert "tasks whose names differ only in case: 'a' and 'A'" in r.stderr, r.stderr
    assert not (tmp_path / "data").exists()


# ------------------------------------------------------------------ verify and quarantine of a campaign


def test_verify_of_a_campaign_verifies_its_log_and_every_run_a_section_each(built):
    r = invoke(built, "verify", "camp")
    assert r.exit_code == 0, r.output
    heads = [line for line in r.stdout.splitlines() if line.startswith(("campaign camp:", "run camp-"))]
    assert [h.split(":")[0] for h in heads] == ["campaign camp", "run camp-a", "run camp-b"]
    assert r.stdout.splitlines()[-1] == "verify campaign camp: its log and 2 run(s) verify"
    document = json.loads(invoke(built, "verify", "camp", "--json").stdout)
    assert document["ok"] and document["damaged"] == []
    assert [(s["log"], s["run_id"], s["ok"]) for s in document["logs"]] == [
        ("campaign", "camp", True),
        ("run", "camp-a", True),
        ("run", "camp-b", True),
    ]
    alone = invoke(built, "verify", "camp-a")  # a run's verify is as it was: one section, its own
    assert alone.exit_code == 0 and alone.stdout.startswith("run camp-a: ") and "camp-b" not in alone.stdout


def test_a_campaigns_watch_and_verify_each_build_one_derived_state(built, derived_made):
    """Every run of the campaign is read through the command's one reader (issue 55)."""
    for command in (["watch", "camp", "--once"], ["verify", "camp"]):
        derived_made.clear()
        r = invoke(built, *command)
        assert r.exit_code == 0 and "camp-b" in r.output, r.output
        assert len(derived_made) == 1, command


@pytest.mark.slow
def test_a_damaged_campaign_record_names_a_verify_and_a_quarantine_that_work_as_printed(data):
    """Finding 7: replay, audit and watch of a campaign whose record was overwritten said 'verify NAME',
    which could not read a campaign."""
    (data / "campaigns" / "runs" / "camp" / "log" / "_record.jsonl").write_text("<html>a report</html>\n")
    verify = None
    for command in (["replay", "camp"], ["audit", "camp"], ["watch", "camp", "--once"]):
        r = invoke(data, *command)
        assert r.exit_code == 1 and "Traceback" not in r.output, (command, r.output)
        verify = hint(r.stderr, " - '", "'")
        assert verify == f"python cli.py --data {data} verify camp", r.stderr
    checked = run_as_printed(verify)
    assert checked.exit_code == 1, checked.output
    assert checked.stdout.splitlines()[-1].startswith("verify campaign camp: 1 of 3 logs damaged (campaign camp)")
    quarantine = hint(checked.stdout, "moved aside: ")
    assert quarantine == f"python cli.py --data {data} quarantine camp _record.jsonl"
    done = run_as_printed(quarantine)
    assert done.exit_code == 0 and done.stdout.startswith("campaign camp: moved _record.jsonl to "), done.output
    assert run_as_printed(verify).exit_code == 0
    assert invoke(data, "replay", "camp").exit_code == 0


@pytest.mark.slow
def test_a_damaged_part_of_a_campaigns_log_names_commands_that_move_it_and_resume(data):
    part = campaign_part(data)  # the last: the campaign's stop and its RunFinished
    flip(part)
    r = invoke(data, "replay", "camp")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert hint(r.stderr, " - '", "'") == f"python cli.py --data {data} verify camp"
    quarantine = hint(r.stderr, "checks every part, '", "'")
    assert quarantine == f"python cli.py --data {data} quarantine camp {part.name}"
    checked = run_as_printed(f"python cli.py --data {data} verify camp")
    assert checked.exit_code == 1 and "DAMAGED  " + part.name in checked.stdout
    assert hint(checked.stdout, "moved aside: ") == quarantine
    done = run_as_printed(quarantine)
    assert done.exit_code == 0 and done.stdout.startswith("campaign camp: moved 1 part(s)"), done.output
    resume = hint(done.stdout, "the campaign continues with: ")
    assert resume == f"python cli.py --data {data} campaign --resume camp"
    copied = part.parent / "notes.txt"  # the writer opens the campaign's log to resume it, and refuses
    copied.write_text("mine\n")
    refused = run_as_printed(resume)
    assert refused.exit_code == 1 and "nothing was appended" in refused.stderr, refused.output
    assert hint(refused.stderr, "nothing was appended; '", "'") == f"python cli.py --data {data} verify camp"
    moved = run_as_printed(hint(refused.stderr, "lists such files, '", "'"))
    assert moved.exit_code == 0 and not copied.exists(), moved.output
    assert run_as_printed(resume).exit_code == 0
    assert invoke(data, "verify", "camp").exit_code == 0
    assert json.loads(invoke(data, "replay", "camp", "--json").stdout)["differ"] == 0


def test_a_part_the_campaigns_record_names_but_is_missing_is_found_and_moved(data):
    part = campaign_part(data)
    part.unlink()
    r = invoke(data, "audit", "camp")
    assert r.exit_code == 1 and hint(r.stderr, "inconsistent ('", "'") == f"python cli.py --data {data} verify camp"
    checked = invoke(data, "verify", "camp")
    assert checked.exit_code == 1 and "named by the run's record, but missing" in checked.stdout
    done = run_as_printed(hint(checked.stdout, "moved aside: "))
    assert done.exit_code == 0 and done.stdout.startswith("campaign camp: moved 1 part(s)"), done.output
    assert invoke(data, "verify", "camp").exit_code == 0


def test_verify_of_a_campaign_names_a_damaged_run_and_quarantine_of_the_campaign_finds_its_part(data):
    part = EventLog(data, "camp-b").parts()[-1].path
    flip(part)
    r = invoke(data, "verify", "camp")
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines()[-1].startswith("verify campaign camp: 1 of 3 logs damaged (run camp-b)")
    assert hint(r.stdout, "moved aside: ") == f"python cli.py --data {data} quarantine camp-b {part.name}"
    document = json.loads(invoke(data, "verify", "camp", "--json").stdout)
    assert not document["ok"] and document["damaged"] == ["run camp-b"]
    assert [s["first_bad"] for s in document["logs"]] == [None, None, part.name]
    unknown = invoke(data, "quarantine", "camp", "part-nothing.parquet")
    assert unknown.exit_code == 1 and "none of its logs names 'part-nothing.parquet'" in unknown.stderr
    assert run_as_printed(hint(unknown.stderr, " - '", "'")).exit_code == 1  # its verify, as printed: the damage
    done = invoke(data, "quarantine", "camp", part.name)  # the campaign's name: the log that names the part
    assert done.exit_code == 0 and done.stdout.startswith(f"run camp-b: moved 1 part(s) to {data}/runs/camp-b/"), (
        done.output
    )
    assert invoke(data, "verify", "camp").exit_code == 0


def test_a_file_copied_into_two_of_a_campaigns_logs_is_named_by_its_path(data):
    copied = [data / d / "log" / "notes.txt" for d in ("campaigns/runs/camp", "runs/camp-a")]
    for path in copied:
        path.write_text("mine\n")
    r = invoke(data, "verify", "camp")
    assert r.exit_code == 1 and r.stdout.count("FOREIGN") == 2, r.output
    moves = [line.split("moved aside: ", 1)[1].rstrip(")") for line in r.stdout.splitlines() if "FOREIGN" in line]
    assert moves == [
        f"python cli.py --data {data} quarantine camp notes.txt",
        f"python cli.py --data {data} quarantine camp-a notes.txt",
    ]
    ambiguous = run_as_printed(moves[0])  # the campaign's name: notes.txt is in two of its logs
    assert ambiguous.exit_code == 1 and f"({copied[0]}, {copied[1]})" in ambiguous.stderr, ambiguous.output
    assert "name the one to move by its path" in ambiguous.stderr and all(p.exists() for p in copied)
    for path in copied:
        done = invoke(data, "quarantine", "camp", str(path))
        assert done.exit_code == 0 and not path.exists(), done.output
    assert invoke(data, "verify", "camp").exit_code == 0
