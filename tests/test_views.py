"""Meta-tests over the view catalog: every view builds, documents itself and keeps its grain."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli import cli
from engine.catalog import Catalog, read_views

VIEWS = read_views()


@pytest.fixture(scope="module")
def empty() -> Catalog:
    return Catalog.empty()


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_builds_on_an_empty_log_and_has_a_header(empty, name):
    view = VIEWS[name]
    assert view.summary and not view.summary.startswith("grain")
    assert view.grain, f"{name}: no grain"
    rows = empty.query(f"select * from {name}")
    assert rows == [] or name == "run_config"
    columns = [d[0] for d in empty.con.execute(f"select * from {name} limit 0").description]
    assert set(view.grain) <= set(columns), f"{name}: grain {view.grain} not in its columns"


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_declared_sources_match_the_sql(empty, name):
    from engine.catalog import view_sources

    view = VIEWS[name]
    assert set(view.sources) == view_sources(empty.con, view)


def test_only_staging_views_read_events(empty):
    from engine.catalog import view_sources

    readers = {n for n, v in VIEWS.items() if "events" in view_sources(empty.con, v)}
    assert readers == {n for n in VIEWS if n.startswith("stg_")}


def test_views_command_lists_every_view_with_its_header():
    r = CliRunner().invoke(cli, ["views"])
    assert r.exit_code == 0
    for view in VIEWS.values():
        assert f"{view.name}\n    {view.summary}\n    grain: {', '.join(view.grain)}" in r.stdout
