"""`report`: one self-contained HTML file, opened in real headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import copy_run

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def open_in_chromium(report: Path, screenshot: Path | None = None) -> dict:
    """Load the file in headless Chromium: what it drew, what it logged, what it fetched."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (.ci/run installs it)"
    seen: dict = {"errors": [], "requests": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            seen["drawn"] = page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('section.run')].map(s => [s.dataset.run, "
                "Object.fromEntries([...s.querySelectorAll('svg.tree')].map(t => [t.dataset.tree, {"
                "nodes: [...t.querySelectorAll('g.n')].map(g => g.dataset.node), "
                "selected: [...t.querySelectorAll('g.n.sel')].map(g => g.dataset.node)}]))]))"
            )
            seen["charts"] = page.evaluate("[...document.querySelectorAll('svg.chart')].map(c => c.dataset.chart)")
            page.locator("svg.tree g.n.sel").first.click()
            seen["panel"] = page.evaluate("document.getElementById('panel').textContent")
            if screenshot:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return seen


def expected(data: Path, run_id: str) -> dict:
    cat = Catalog.for_log(EventLog(data, run_id))
    nodes: dict[str, set] = {}
    for r in cat.query("select tree_id, node_id from nodes"):
        nodes.setdefault(r["tree_id"], set()).add(r["node_id"])
    selected: dict[str, set] = {t: set() for t in nodes}
    for r in cat.query("select tree_id, node_ids from top_paths"):
        selected[r["tree_id"]] |= set(r["node_ids"])
    return {"nodes": nodes, "selected": selected}


@pytest.mark.slow
def test_the_report_draws_every_tree_and_chart_and_fetches_nothing(runs, tmp_path):
    data = tmp_path / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["--data", str(data), "report", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith(f"wrote {out} (") and out.stat().st_size > 10_000
    text = out.read_text()
    assert "http://" not in text and "https://" not in text and "<link" not in text and "src=" not in text
    seen = open_in_chromium(out, tmp_path / "report.png")
    assert seen["errors"] == [] and seen["requests"] == [out.as_uri()]
    for run in ("rounds", "async"):
        want = expected(data, run)
        drawn = seen["drawn"][run]
        assert {t: set(d["nodes"]) for t, d in drawn.items()} == want["nodes"]
        assert {t: set(d["selected"]) for t, d in drawn.items()} == want["selected"]
        assert sum(len(d["nodes"]) for d in drawn.values()) == sum(len(v) for v in want["nodes"].values())
    assert seen["charts"].count("neff") == 2 and {"stages", "tool errors", "knowledge"} <= set(seen["charts"])
    assert seen["panel"].startswith("node T") and "soft" in seen["panel"]
    assert "<h2>collection</h2>" in text  # several runs: an overview first
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_report_errors_are_clean(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    r = CliRunner().invoke(cli, ["--data", str(data), "report", "nope", "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "run 'nope' not found" in r.stderr and not (tmp_path / "r.html").exists()
    nowhere = tmp_path / "no" / "such" / "dir" / "r.html"
    r = CliRunner().invoke(cli, ["--data", str(data), "report", "rounds", "--out", str(nowhere)])
    assert r.exit_code == 1 and r.stderr.startswith(f"Error: {nowhere}: cannot write the report")
    assert not nowhere.parent.exists()


def test_runs_read_together_draw_the_report_of_runs_read_one_by_one(runs, tmp_path, monkeypatch):
    """The report reads each view once for a batch of runs; each run's rows are its own whatever the batch."""
    import engine.report

    data = tmp_path / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)
    written = {}
    for batch in (1, engine.report.BATCH_RUNS):
        monkeypatch.setattr(engine.report, "BATCH_RUNS", batch)
        out = tmp_path / f"report-{batch}.html"
        r = CliRunner().invoke(cli, ["--data", str(data), "report", "--out", str(out)])
        assert r.exit_code == 0, r.output
        written[batch] = out.read_text()
    one_by_one, together = written.values()
    assert together == one_by_one
    for run in ("rounds", "async"):  # each section draws its own run's trees
        section = together.split(f'data-run="{run}"')[1].split("</section>")[0]
        drawn = {t.split('"')[0] for t in section.split('data-tree="')[1:]}
        assert drawn == set(expected(data, run)["nodes"])
