"""What a first day at the command line meets: help that lists every choice, errors that say what to add."""

from __future__ import annotations

from click.testing import CliRunner

from cli import cli
from engine.audit import strata
from tests.conftest import SNAPSHOTS


def test_audit_help_names_every_stratum_by_takes():
    r = CliRunner().invoke(cli, ["audit", "--help"])
    listed = " ".join(r.stdout.split()).split("Strata of the coverage table: any of ", 1)[1].split(".", 1)[0]
    assert listed.split(", ") == list(strata())  # the strata of views/coverage_strata.sql


def test_explore_of_an_all_snapshots_dir_without_select_suggests_it(tmp_path):
    r = CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "explore", str(SNAPSHOTS)])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith(f"Error: {SNAPSHOTS}: cannot use every folder as a root: ")
    assert r.stderr.rstrip().endswith(
        "to select the roots from a task's all_snapshots dir or a CORAL run first, add --select --task NAME)"
    )
    assert not (tmp_path / "data" / "runs").exists() or not any((tmp_path / "data" / "runs").iterdir())


def test_the_command_line_stays_thin():
    """cli.py parses and prints; what it prints is in engine/outputs/, the rest in engine/ modules."""
    from tests.conftest import ROOT

    # The options several commands take are declared once (engine/commandline.py), and explore's
    # start and resume are the library's (engine/explore_options.py), as campaign's are.
    assert len((ROOT / "cli.py").read_text().splitlines()) <= 800
    long = {
        str(p.relative_to(ROOT)): n
        for folder in ("engine", "ingest")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}
