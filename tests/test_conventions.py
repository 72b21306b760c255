"""Conventions the project keeps: documented commands, staging views per event kind."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import ROOT

from cli import cli

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_has_help_and_is_in_the_readme(name):
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0
    assert cli.commands[name].help and "Example:" in r.stdout
    assert f"python cli.py {name}" in README


def test_every_public_view_of_the_spec_is_documented():
    for view in ("snapshots", "trees", "turns", "edges", "nodes", "selections", "paths",
                 "top_paths", "tool_calls"):  # fmt: skip
        assert f"| `{view}` |" in README
