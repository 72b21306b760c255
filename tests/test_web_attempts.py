"""The viewer shows every attempt and every failure (issue 54), in a real browser (Playwright, the system
Chromium) against a ``serve`` process of its own, as tests/test_web.py does."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest
from test_web import browser, page, served, shot, two_runs  # noqa: F401 - fixtures

from engine.catalog import Catalog
from ingest.log import EventLog


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
def test_every_leaf_link_of_a_tree_opens_its_path_selected_or_not(two_runs, tmp_path, page):  # noqa: F811
    catalog = Catalog.for_log(EventLog(two_runs, "rounds"))
    paths = catalog.query("select tree_id, leaf_id, selected, rank from paths order by tree_id, leaf_id")
    assert {p["selected"] for p in paths} == {True, False}  # (the run has paths it did not select)
    with served(two_runs, tmp_path) as server:
        base = f"{server.base}/t/{server.token}"
        refused = []
        page.on("response", lambda r: refused.append(r.url) if r.status >= 400 else None)
        page.goto(f"{base}/run/rounds/tree/T001")
        assert page.locator("p.summary.cost").inner_text().count("time unknown (not measured)") == 1  # not "0 s"
        links = page.locator("form.compare-paths table.paths tbody a").evaluate_all("as => as.map(a => a.href)")
        assert len(links) == sum(p["tree_id"] == "T001" for p in paths)
        for tree in sorted({p["tree_id"] for p in paths}):  # every leaf of every tree answers
            for p in (p for p in paths if p["tree_id"] == tree):
                url = f"{server.base}/run/rounds/path?tree={tree}&leaf={p['leaf_id']}"
                assert _status(url, server.token) == 200, url
        unselected = next(p for p in paths if p["tree_id"] == "T001" and not p["selected"])
        page.locator("table.paths a", has_text=re.compile(f"^{re.escape(unselected['leaf_id'])}$")).click()
        page.wait_for_url(re.compile(r"/run/rounds/path\?"), timeout=60_000)
        banner = page.locator("#selection")
        assert "unselected" in banner.get_attribute("class")
        assert banner.inner_text().startswith("not selected")  # a label, readable without colour
        assert f"rank {unselected['rank']}" in banner.inner_text()
        depth = catalog.query(
            "select depth from paths where tree_id = 'T001' and leaf_id = ?", [unselected["leaf_id"]]
        )[0]["depth"]
        verdicts = page.locator("table.verdicts tbody tr, table.verdicts > tr")
        assert verdicts.count() == depth  # an edge per node below the root, each with its verdict
        assert page.locator(".conversation .msg").count() > 0 and page.locator(".conversation .eval").count() > 0
        shot(page, "path-unselected")
        selected = next(p for p in paths if p["tree_id"] == "T001" and p["selected"])
        page.goto(f"{base}/run/rounds/path?tree=T001&leaf={selected['leaf_id']}")
        assert page.locator("#selection").inner_text().startswith("selected")
        assert f"#{selected['rank']}" in page.locator("#selection").inner_text()
        # A selected and an unselected path compared side by side.
        page.goto(f"{base}/run/rounds/tree/T001")
        page.locator(f'input[name="leaf"][value="{selected["leaf_id"]}"]').check()
        page.locator(f'input[name="leaf"][value="{unselected["leaf_id"]}"]').check()
        page.locator("form.compare-paths button").click()
        page.wait_for_url(re.compile(r"/paths\?leaf="), timeout=60_000)
        assert page.locator("section.path-column").count() == 2
        assert refused == []  # every page's requests answered (its icon is inline: no favicon.ico 404)
        # A run's name mistyped: 404 "unknown run" (a run on disk, or being written, has its page).
        answer = page.goto(f"{base}/run/roundz")
        assert answer.status == 404 and "Unknown run" in page.locator("#unknown-run").inner_text()
        assert page.goto(f"{base}/run/rounds").status == 200 and page.locator("#unknown-run").count() == 0
        # A leaf the tree does not have: a clear 404, not a 500.
        assert _status(f"{server.base}/run/rounds/path?tree=T001&leaf=T001.9.9", server.token) == 404
        assert _status(f"{server.base}/run/rounds/path?tree=T001&leaf=%00..%2F", server.token) == 404


@pytest.mark.slow
def test_failures_are_marked_counted_and_jumped_to_in_every_transcript(two_runs, tmp_path, page):  # noqa: F811
    catalog = Catalog.for_log(EventLog(two_runs, "rounds"))
    # The path with the most failures, and how many the views count on it.
    counts = catalog.query(
        "select w.tree_id, w.leaf_id, count(f.seq) filter (where f.kind = 'tool') as tools, "
        "count(f.seq) filter (where f.kind = 'eval') as evals from path_turns as w left join failures as f "
        "on f.tree_id = w.tree_id and f.edge_id = w.edge_id and f.turn = w.turn where w.turn > 0 "
        "group by all order by tools + evals desc, w.leaf_id limit 1"
    )[0]
    assert counts["tools"] > 1 and counts["evals"] >= 1, counts  # (the sim fails calls and crashes graders)
    with served(two_runs, tmp_path) as server:
        base = f"{server.base}/t/{server.token}"
        page.goto(f"{base}/run/rounds/path?tree={counts['tree_id']}&leaf={counts['leaf_id']}")
        failed = page.locator('.conversation .msg.failed[data-role="tool"]')
        assert failed.count() == counts["tools"]
        assert page.locator(".conversation .eval.failed").count() == counts["evals"]
        assert failed.first.locator(".label.failure").text_content() == "failed call"  # words, not only colour
        assert page.locator(".conversation .msg:not(.failed) .label.failure").count() == 0
        total = counts["tools"] + counts["evals"]
        assert f"{total} failures on this path" in page.locator("#failures").inner_text()
        # Jump from failure to failure through plain anchors: each lands on the next, the last says so.
        page.locator("#failures a.next-failure").click()
        seen = []
        for _ in range(total):
            target = page.evaluate("document.querySelector(':target').id")
            assert target not in seen
            seen.append(target)
            mark = page.locator(f"[id='{target}']")
            assert "failed" in mark.get_attribute("class")
            nxt = mark.locator("a.next-failure")
            if nxt.count() == 0:
                break
            nxt.first.click()
        assert len(seen) == total
        shot(page, "path-failures")
        # The compare page: a crashed or timed-out grader shows its status, not only "no score".
        node = catalog.query(
            "select e.parent_id from failures as f join edges as e using (run_id, tree_id, edge_id) "
            "where f.kind = 'eval' and e.verdict is not null order by f.seq limit 1"
        )[0]["parent_id"]
        tree = node.split(".")[0]
        page.goto(f"{base}/run/rounds/tree/{tree}/compare?node={node}")
        crashed = page.locator(".eval.failed")
        assert crashed.count() >= 1
        assert crashed.first.locator(".eval-status").inner_text() in ("crashed", "timeout")
        assert crashed.first.locator(".label.failure").text_content().startswith("eval ")


@pytest.mark.slow
def test_a_search_for_failed_calls_alone_counts_each_once_by_attempt_and_pages_on(two_runs, tmp_path, page):  # noqa: F811
    failed, crashed = [], 0
    for run in ("rounds", "async"):
        catalog = Catalog.for_log(EventLog(two_runs, run))
        failed += catalog.query("select run_id, edge_id, call_id from failures where kind = 'tool'")
        crashed += catalog.query("select count(*) as n from failures where status = 'crashed'")[0]["n"]
    attempts = {(f["run_id"], f["edge_id"]) for f in failed}
    assert len(failed) > 200  # (more than a page)
    with served(two_runs, tmp_path) as server:
        page.goto(f"{server.base}/t/{server.token}/search")
        page.locator('input[name="errors"]').check()  # no text, no tool: failed calls alone
        page.locator("form.search button").click()
        page.wait_for_url(re.compile(r"/search\?"), timeout=60_000)
        count = page.locator("#search-count").inner_text()
        assert count.startswith(f"{len(failed)} hits in {len(attempts)} attempts"), count
        assert page.locator("table.attempts tbody tr").count() == min(len(attempts), 100)
        listed = page.locator("table.attempts tbody tr td:last-child").all_inner_texts()
        assert sum(int(n) for n in listed) == len(failed) or len(attempts) > 100
        rows = page.locator("table.hits tbody tr")
        kinds = rows.locator("td:nth-child(7)").all_inner_texts()
        assert rows.count() == 200 and all(k.startswith("result") for k in kinds)  # a failed call once: its result
        shot(page, "search-failures")
        page.locator("#pages a[rel=next]").click()
        page.wait_for_url(re.compile(r"page=2"), timeout=60_000)
        assert page.locator("table.hits tbody tr").count() == len(failed) - 200
        assert "page 2 of 2" in page.locator("#search-count").inner_text()
        # An eval's status (and feedback) is searched too: a crashed grader is found by its status.
        page.goto(f"{server.base}/t/{server.token}/search?q=crashed&kind=feedback")
        assert page.locator("#search-count").inner_text().startswith(f"{crashed} hits"), crashed
        assert crashed > 0 and page.locator("table.hits mark").first.inner_text() == "crashed"
        page.goto(f"{server.base}/t/{server.token}/search?errors=1&page=-1")
        assert "is not a page number" in page.locator("#search-error").inner_text()


@pytest.mark.slow
def test_a_saved_link_opens_after_a_restart_and_a_token_others_can_read_is_replaced(two_runs, tmp_path, page):  # noqa: F811
    import stat

    from engine.web.tokens import token_path

    config = tmp_path / "config"
    env = {"XDG_CONFIG_HOME": str(config)}
    link = "/run/rounds/tree/T001"
    with served(two_runs, tmp_path, env=env, kept=True) as first:
        saved = f"{first.base}/t/{first.token}{link}"
        assert page.goto(saved).status == 200
    kept = config / "teacher-mcts" / "serve-tokens" / token_path(two_runs.resolve()).name
    assert kept.read_text().strip() == first.token
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and not list(two_runs.rglob("serve-tokens"))  # (not in data)
    with served(two_runs, tmp_path, env=env, kept=True) as second:
        assert second.token == first.token
        assert page.goto(saved.replace(first.base, second.base)).status == 200  # the saved link, after a restart
        assert page.locator("h1").inner_text().startswith("Tree T001")
    kept.chmod(0o644)  # others may read it: not trusted, replaced
    with served(two_runs, tmp_path, env=env, kept=True) as third:
        assert third.token != first.token and "was not used" in third.log.read_text()
        assert page.goto(f"{third.base}/t/{first.token}{link}").status == 403
        assert page.goto(f"{third.base}/t/{third.token}{link}").status == 200
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text().strip() == third.token
