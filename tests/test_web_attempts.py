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


def _number(text: str) -> int:
    return int(re.search(r"[\d,]+", text)[0].replace(",", ""))


@pytest.mark.slow
def test_a_count_links_to_exactly_its_rows_and_an_sql_id_to_its_page(two_runs, tmp_path, page):  # noqa: F811
    catalog = Catalog.for_log(EventLog(two_runs, "rounds"))
    pruned = catalog.query("select count(*) as n from edges where verdict = 'pruned'")[0]["n"]
    failed = catalog.query("select count(*) as n from failures where kind = 'tool'")[0]["n"]
    assert pruned > 0 and failed > 0
    with served(two_runs, tmp_path) as server:
        base = f"{server.base}/t/{server.token}"
        # The run page: its pruned attempts, listed one a row; its failed calls, each once.
        page.goto(f"{base}/run/rounds")
        link = page.locator("#pruned-count")
        assert _number(link.inner_text()) == pruned
        link.click()
        page.wait_for_url(re.compile(r"show=attempts"), timeout=60_000)
        assert page.locator("#list-count").inner_text().startswith(f"{pruned} attempts")
        verdicts = page.locator("table.attempts-listed tbody tr td:nth-child(5)").all_inner_texts()
        assert verdicts == ["pruned"] * pruned
        page.goto(f"{base}/run/rounds")
        assert _number(page.locator("#errors-count").inner_text()) == failed
        page.locator("#errors-count").click()
        page.wait_for_url(re.compile(r"errors=1"), timeout=60_000)
        assert page.locator("#search-count").inner_text().startswith(f"{failed} hits")
        # A node's error count: the failed calls of the attempt that made it.
        edge = catalog.query(
            "select f.tree_id, f.edge_id, e.child_id, count(*) as n from failures as f join edges as e "
            "using (run_id, tree_id, edge_id) where f.kind = 'tool' and e.child_id is not null group by all "
            "order by n desc, edge_id limit 1"
        )[0]
        page.goto(f"{base}/run/rounds/tree/{edge['tree_id']}")
        cell = page.locator(f'[id="node-{edge["child_id"]}"] a.count.errors')
        assert _number(cell.inner_text()) == edge["n"]
        cell.click()
        page.wait_for_url(re.compile(r"edge="), timeout=60_000)
        assert page.locator("#search-count").inner_text().startswith(f"{edge['n']} hits in 1 attempt")
        assert page.locator("table.hits tbody tr").count() == edge["n"]
        # The collection: a coverage cell's paths, a tool's and an error message's failed calls.
        page.goto(f"{base}/")
        cells = page.locator("table.coverage tbody tr").filter(has_text="stage")
        for column in (5, 7, 12):  # candidate, selected paths; pruned edges
            cell = cells.first.locator(f"td:nth-child({column}) a")
            shown = _number(cell.inner_text())
            cell.click()
            page.wait_for_url(re.compile(r"show="), timeout=60_000)
            assert _number(page.locator("#list-count").inner_text()) == shown
            assert page.locator("table.listed tbody tr").count() == shown
            page.go_back()
        for table in ("tool-errors", "tool-messages"):
            cell = page.locator(f"table.{table} tbody td a[href*='errors=1']").last
            shown = _number(cell.inner_text())
            cell.click()
            page.wait_for_url(re.compile(r"errors=1"), timeout=60_000)
            assert page.locator("#search-count").inner_text().startswith(f"{shown} hit"), table
            page.go_back()
        shot(page, "collection-links")
        # The SQL page: a result's node, edge, path and call ids link to pages that answer.
        page.goto(f"{base}/sql")
        page.fill(
            "#q",
            "select f.run_id, f.tree_id, f.edge_id, f.call_id, e.parent_id, p.leaf_id from failures as f "
            "join edges as e using (run_id, tree_id, edge_id) join paths as p using (run_id, tree_id) "
            "where f.kind = 'tool' order by f.seq limit 3",
        )
        page.locator("button.run").click()
        page.wait_for_selector("#sql-count", timeout=60_000)
        hrefs = page.locator("table.result a.id").evaluate_all("as => as.map(a => a.href)")
        assert len(hrefs) == 3 * 4  # (edge, call, node, path of each row; run and tree ids are no page's)
        for href in hrefs:
            assert _status(href, server.token) == 200, href
        page.locator("table.result a.id").nth(1).click()  # a call: its place on its node's compare page
        page.wait_for_url(re.compile(r"/compare\?node="), timeout=60_000)
        target = page.evaluate("document.querySelector(':target') && document.querySelector(':target').id")
        assert target and "-call-" in target


@pytest.mark.slow
def test_the_collection_sorts_by_start_and_filters_by_text_with_and_without_script(two_runs, tmp_path, browser):  # noqa: F811
    started = {}
    for run in ("rounds", "async"):
        catalog = Catalog.for_log(EventLog(two_runs, run))
        started[run] = catalog.query("select started_at, run_seconds from run_pace")[0]
    first, last = sorted(started, key=lambda r: started[r]["started_at"])
    with served(two_runs, tmp_path) as server:
        base = f"{server.base}/t/{server.token}"
        for script in (True, False):
            context = browser.new_context(viewport={"width": 1024, "height": 800}, java_script_enabled=script)
            page = context.new_page()
            try:
                page.goto(f"{base}/")
                rows = page.locator("table.runs tbody tr")
                columns = page.locator("table.runs thead th").all_inner_texts()
                at = columns.index("started") + 1
                for cell in rows.locator(f"td:nth-child({at + 1})").all_inner_texts():  # the duration
                    assert re.fullmatch(r"\d+s|\d+m \d\ds|\d+h \d\dm", cell), cell
                page.locator("table.runs thead a", has_text="started").click()
                page.wait_for_url(re.compile(r"sort=started&order=asc"), timeout=60_000)
                assert rows.locator("td:first-child").all_inner_texts() == [first, last]
                page.locator("table.runs thead a", has_text="started").click()
                page.wait_for_url(re.compile(r"order=desc"), timeout=60_000)
                assert rows.locator("td:first-child").all_inner_texts() == [last, first]
                assert page.locator("table.runs th[aria-sort=descending]").inner_text() == "started"
                page.fill("#collection-filter input[name=q]", first[:4].upper())  # any case
                page.locator("#collection-filter button").click()
                page.wait_for_url(re.compile(r"q="), timeout=60_000)
                assert rows.locator("td:first-child").all_inner_texts() == [first]
                assert "sort=started" in page.url  # (the sorting kept)
                assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
                shot(page, f"collection-sorted-{'js' if script else 'nojs'}")
            finally:
                context.close()
