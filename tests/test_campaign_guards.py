"""Issue 33, findings 7 and 9: no output lands on a log, a record or derived state; a campaign's
tasks differ in more than case. One small campaign (two tasks of two roots), built once and
copied by each test that changes it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
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


def hashes(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


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


# ------------------------------------------------------------------ outputs never land on a log


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
    from engine.campaign.names import campaigns_dir
    from engine.derived.keys import DERIVED
    from ingest.paths import CAMPAIGNS, GUARDED
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
