"""The documentation's examples run as shown: the campaign file of docs/CAMPAIGNS.md, the
sessions of docs/VIEWS.md, the run config of docs/CONFIGURATION.md.

As tests/test_readme.py does for README: a ``text`` block shows what the commands print,
each of its lines in order (``…`` stands for anything; a line of only ``…`` for lines left
out). The commands run in-process (these tests are about what they print, not the process).
"""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
from click.testing import CliRunner

from cli import cli
from engine.config import RunConfig
from tests.conftest import ROOT, SNAPSHOTS, copy_run
from tests.test_readme import expect_in_order, fenced_blocks

DOCS = ROOT / "docs"


def blocks(name: str, language: str) -> list[str]:
    return [body for lang, body in fenced_blocks((DOCS / name).read_text()) if lang == language]


@pytest.mark.slow
def test_the_campaign_example_runs_as_shown_and_keeps_to_its_budget(tmp_path):
    """The example spent 121.5M tokens of its 40M budget in its first pass and never showed a
    coverage round. Its task's source is the bundled Student run here, and its coral_dir
    (for the opencode backend) is left out."""
    (example,) = blocks("CAMPAIGNS.md", "toml")
    text = example.replace('"runs/kernel/all_snapshots"', f'"{SNAPSHOTS}"')
    text = re.sub(r"(?m)^coral_dir = .*\n", "", text)
    assert text != example and tomllib.loads(text)["tasks"][0]["source"] == str(SNAPSHOTS)
    (tmp_path / "campaign.toml").write_text(text)
    (shown,) = blocks("CAMPAIGNS.md", "text")

    r = CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "campaign", str(tmp_path / "campaign.toml")])

    assert r.exit_code == 0, r.output
    assert expect_in_order(shown, r.stderr + r.stdout) == [], r.stderr + r.stdout
    rules = re.findall(r"^campaign campaign: round \d+ \((\w+)\)", r.stderr, re.M)
    assert rules[:2] == ["first_pass", "first_pass"] and "coverage" in rules, r.stderr
    budget = tomllib.loads(text)["budget"]["tokens"]
    tokens = int(r.stdout.split("\ntotal")[1].split()[2])
    assert budget <= tokens <= 1.05 * budget, tokens  # spent, overrun by the last blocks at most


@pytest.mark.slow
def test_the_views_sessions_print_what_they_show(bundled, tmp_path):
    """The main job's run under data/ (as its default id), then each ``$`` line of the block."""
    (session,) = (b for b in blocks("VIEWS.md", "text") if b.startswith("$ python cli.py audit"))
    run_id = re.search(r"audit of 1 run\(s\): (explore-kernel-speedup-\d{8}T\d{6}Z)$", session, re.M).group(1)
    data = tmp_path / "data"
    copy_run(bundled, "main", data, run_id)
    output = []
    for line in session.splitlines():
        if line.startswith("$ python cli.py "):
            r = CliRunner().invoke(cli, ["--data", str(data), *shlex.split(line)[3:]])
            assert r.exit_code == 0, (line, r.output)
            output += [line, r.stdout]
    assert expect_in_order(session, "\n".join(output)) == [], "\n".join(output)


def test_the_configuration_example_is_a_run_config():
    (example,) = blocks("CONFIGURATION.md", "toml")
    config = RunConfig.model_validate(tomllib.loads(example))
    assert config.parallel == 16 and config.schedule == "async" and config.tree.target_good_leaves == 12
