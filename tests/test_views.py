"""Meta-tests over the view catalog: every view builds, documents itself and keeps its grain."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli import cli
from engine.catalog import Catalog, read_views

VIEWS = read_views()
ONE_ROW_VIEWS = {"run_progress", "stg_log_tail"}  # whole-run summaries: one row even when empty


@pytest.fixture(scope="module")
def empty() -> Catalog:
    return Catalog.empty()


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_builds_on_an_empty_log_and_has_a_header(empty, name):
    view = VIEWS[name]
    assert view.summary and not view.summary.startswith("grain")
    assert view.grain, f"{name}: no grain"
    rows = empty.query(f"select * from {name}")
    assert rows == [] or name in ONE_ROW_VIEWS
    columns = [d[0] for d in empty.con.execute(f"select * from {name} limit 0").description]
    assert set(view.grain) <= set(columns), f"{name}: grain {view.grain} not in its columns"


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_declared_sources_match_the_sql(empty, name):
    from engine.catalog import view_sources

    view = VIEWS[name]
    assert set(view.sources) == view_sources(empty.con, view)


def test_only_staging_views_read_the_log_tables(empty):
    from engine.catalog import KIND_COLUMNS, view_sources

    log_tables = {f"log_{k}" for k in KIND_COLUMNS} | {"log_tail", "event_log"}
    readers = {n for n, v in VIEWS.items() if view_sources(empty.con, v) & log_tables}
    assert readers == {n for n in VIEWS if n.startswith("stg_")} | {"events"}


def test_every_event_kind_has_its_staging_view():
    from ingest.events import EVENT_TYPES

    staging = {n[4:] for n in VIEWS if n.startswith("stg_")} - {"log_tail"}
    assert staging == set(EVENT_TYPES)


def test_views_command_lists_every_view_with_its_header():
    r = CliRunner().invoke(cli, ["views"])
    assert r.exit_code == 0
    for view in VIEWS.values():
        assert f"{view.name}\n    {view.summary}\n    grain: {', '.join(view.grain)}" in r.stdout
