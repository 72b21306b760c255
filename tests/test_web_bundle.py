"""``bundle``: chosen runs' pages as files that open from disk in Chromium with no server (issue 54), driven by
Playwright as tests/test_web.py drives ``serve``; bad input is a one-line error with nothing written."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from click.testing import CliRunner
from test_web import browser, exported, page, sample_messages, shot, shown_messages  # noqa: F401 - fixtures

from cli import cli
from engine.catalog import Catalog
from engine.web.bundle import MANIFEST, _publish
from ingest.log import EventLog

NEW = "give a new or empty directory"
LINK = re.compile(r'\b(?:href|src|action)="([^"]*)"')


def _bundle(data: Path, out: Path, *names: str):
    return CliRunner().invoke(cli, ["--data", str(data), "bundle", *names, "--out", str(out)])


def _links(out: Path) -> dict[Path, list[str]]:
    """Every link (href, src, action) of every page of the bundle, by page."""
    return {p: [html.unescape(v) for v in LINK.findall(p.read_text())] for p in out.rglob("*.html")}


@pytest.mark.slow
def test_a_bundle_opens_from_disk_and_every_link_in_it_is_a_file_of_it(runs, tmp_path, page):  # noqa: F811
    out = tmp_path / "bundle"
    r = _bundle(runs, out, "rounds")
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith(f"wrote {out}: ") and r.stdout == ""
    assert json.loads((out / MANIFEST).read_text())["runs"] == ["rounds"]
    catalog = Catalog.for_log(EventLog(runs, "rounds"))
    paths = catalog.query("select tree_id, leaf_id, selected from paths order by tree_id, leaf_id")
    assert {p["selected"] for p in paths} == {True, False}
    # Every link of every page: an anchor of the page, inline data, or a relative file of the bundle; no server.
    marked = set()
    for here, links in _links(out).items():
        for link in links:
            parts = urlsplit(link)
            if parts.scheme == "data" or link.startswith("#"):
                continue
            assert not parts.scheme and not parts.query and not link.startswith("/"), (here, link)
            target = (here.parent / unquote(parts.path)).resolve()
            assert target.is_file() and target.is_relative_to(out.resolve()), (here, link)
        marked |= set(re.findall(r'data-not-bundled="([^"]*)"', here.read_text()))
    assert {"/search", "/sql"} <= marked  # the pages a bundle has not: kept as text, marked
    assert not any(m.startswith("/run/rounds/path") or m == "/run/rounds/tree/T001" for m in marked)
    failed = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.goto((out / "index.html").as_uri())
    assert page.locator("#collection-filter button").is_disabled()  # filtering and sorting need the server
    assert page.locator("table.runs thead a[href]").count() == 0
    page.locator("table.runs a", has_text="rounds").click()
    page.wait_for_url(re.compile(r"/pages/run-rounds-[0-9a-f]+\.html$"))
    assert page.locator("#live .live-section").count() == 1 and page.locator("#state").inner_text() == ""
    page.locator('.card[data-tree="T002"] svg.tree g[data-node]').first.click()  # a drawn node: its tree page
    page.wait_for_url(re.compile(r"/pages/run-rounds-tree-T002-[0-9a-f]+\.html#node-T002[.0-9]*$"))
    page.goto((out / "index.html").as_uri())
    page.locator("table.runs a", has_text="rounds").click()
    page.locator("table.tree-table a", has_text="T001").click()
    page.wait_for_url(re.compile(r"/pages/run-rounds-tree-T001-[0-9a-f]+\.html$"))
    shot(page, "bundle-tree")
    leaves = page.locator("table.paths tbody a").evaluate_all("as => as.map(a => [a.textContent, a.href])")
    assert sorted(leaf for leaf, _ in leaves) == sorted(p["leaf_id"] for p in paths if p["tree_id"] == "T001")
    for _, href in leaves:  # every leaf's path page is a file of the bundle
        assert href.startswith("file://") and Path(unquote(urlsplit(href).path)).is_file(), href
    assert page.locator("form.compare-paths button").is_disabled()  # ticked paths compared need the server
    assert page.locator("nav.top a", has_text="search").get_attribute("href") is None
    # A selected path shows its conversation as export writes it; an unselected one opens too.
    samples = exported(runs, "rounds", tmp_path / "export")
    chosen = next(p for p in paths if p["tree_id"] == "T001" and p["selected"])
    page.locator("table.paths a", has_text=re.compile(f"^{re.escape(chosen['leaf_id'])}$")).click()
    page.wait_for_url(re.compile(r"/pages/run-rounds-path-tree-T001-leaf-.+\.html$"))
    assert shown_messages(page) == sample_messages(samples[("T001", chosen["leaf_id"])])
    assert page.locator(".conversation .eval").count() > 0
    shot(page, "bundle-path")
    page.go_back()
    other = next(p for p in paths if p["tree_id"] == "T001" and not p["selected"])
    page.locator("table.paths a", has_text=re.compile(f"^{re.escape(other['leaf_id'])}$")).click()
    page.wait_for_url(re.compile(r"/pages/run-rounds-path-tree-T001-leaf-.+\.html$"))
    assert page.locator("#selection").inner_text().startswith("not selected")
    assert page.locator(".conversation .msg").count() > 0
    assert failed == []  # the styles and the script load from disk; nothing is asked of a server


def test_bad_input_is_a_one_line_error_and_nothing_is_written(tmp_path):
    runs = tmp_path / "data"  # (what is refused is refused before any run is read)
    (runs / "runs").mkdir(parents=True)
    out = tmp_path / "bundle"
    r = _bundle(runs, out, "nosuchrun")
    assert r.exit_code == 1 and r.stderr.startswith("Error: run 'nosuchrun' not found under ")
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    inside = runs / "runs" / "bundle"
    r = _bundle(runs, inside, "rounds")
    assert r.exit_code == 1 and r.stderr.startswith(f"Error: {inside}: lies among or holds the runs")
    assert not inside.exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    r = _bundle(runs, taken, "rounds")
    assert r.exit_code == 1
    assert r.stderr == f"Error: {taken}: not empty and not an earlier bundle - {NEW} (nothing was written)\n"
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_bundle_replaces_an_earlier_one_whole_or_not_at_all(tmp_path):
    out = tmp_path / "bundle"

    def write(text: str):
        def files(tmp: Path) -> None:
            (tmp / MANIFEST).write_text(json.dumps({"kind": "teacher-mcts bundle"}))
            (tmp / "index.html").write_text(text)
            if text == "broken":
                raise OSError(28, "No space left on device")

        return files

    _publish(out, write("first"))
    _publish(out, write("second"))  # an earlier bundle is replaced
    assert (out / "index.html").read_text() == "second"
    with pytest.raises(Exception, match="could not be written .No space left on device.; nothing was written"):
        _publish(out, write("broken"))
    assert (out / "index.html").read_text() == "second"  # what it held before, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no half-written sibling left
