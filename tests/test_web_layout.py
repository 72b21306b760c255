"""The viewer shows content as what it is, in pages that fit (issue 54): code a tool call wrote shown as code, an
edit as removed and added lines; at 1024 px no page scrolls sideways outside its own boxes; a deep link is not
under the sticky header; a path has an outline of its turns. In a real browser, as tests/test_web.py drives it."""

from __future__ import annotations

import json

import pytest
from test_web import PAYLOAD, browser, exported, page, sample_messages, served, shot, shown_messages, two_runs  # noqa: F401

from engine.catalog import Catalog
from ingest.log import EventLog

CODE = "def tile(n):\n    return 64  # " + PAYLOAD + "\n\nTILE = tile(1)\n"
EDIT = {"filePath": "/w/solution.py", "oldString": "TILE = 32\nSTEP = 1", "newString": "TILE = 64\nSTEP = 2\n# done"}
FITS = "document.documentElement.scrollWidth <= window.innerWidth"


def _hand_run_with_code(data) -> str:
    """tests/hand_run.py's run, its ``write`` call writing CODE and its next call an ``edit`` (EDIT)."""
    import hand_run

    from engine.selections import default_parameters, selection_decision
    from ingest.events import ConversationRecorded, RunFinished, RunStarted
    from ingest.log import LogWriter

    def call(c):
        if c["id"] == "c3":
            args = {"filePath": "/w/solution.py", "content": CODE}
            return c | {"function": {"name": "write", "arguments": json.dumps(args)}}
        if c["id"] == "c3b":
            return c | {"function": {"name": "edit", "arguments": json.dumps(EDIT)}}
        return c

    def patched(event):
        if isinstance(event, ConversationRecorded):
            messages = [
                m | {"tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
                for m in event.messages
            ]
            return event.model_copy(update={"messages": messages})
        return event

    started = RunStarted(command="explore", task="speedup", config=hand_run.CONFIG.model_dump(mode="json"))
    with LogWriter.create(data, "hand") as writer:
        writer.append([started, *map(patched, hand_run.events())])
        catalog = Catalog.for_log(EventLog(data, "hand"))
        writer.append([selection_decision(catalog, writer.tail, *default_parameters(catalog)), RunFinished()])
    return "hand"


@pytest.mark.slow
def test_code_a_call_wrote_shows_as_code_and_an_edit_as_lines(tmp_path, page):  # noqa: F811
    data = tmp_path / "data"
    _hand_run_with_code(data)
    samples = exported(data, "hand", tmp_path / "out")
    with served(data, tmp_path) as server:
        page.goto(f"{server.base}/t/{server.token}/run/hand/path?tree=T1&leaf=T1.1.1")
        assert page.evaluate("window.__pwned") is None  # no script ran
        assert page.locator(".conversation script, .conversation img").count() == 0
        write = page.locator('.call[data-call-id="c3"]')
        assert write.locator("pre.code-block").inner_text() == CODE  # real lines, no literal \n
        assert "\\n" not in write.locator("pre.code-block").inner_text()
        assert "/w/solution.py" in write.locator("pre.args-rest").inner_text()
        edit = page.locator('.call[data-call-id="c3b"]')
        assert edit.locator("pre.diff.edit span.del").all_inner_texts() == ["- TILE = 32", "- STEP = 1"]
        assert edit.locator("pre.diff.edit span.add").all_inner_texts() == ["+ TILE = 64", "+ STEP = 2", "+ # done"]
        assert shown_messages(page) == sample_messages(samples[("T1", "T1.1.1")])  # the arguments as sent kept
        turns = page.locator(".conversation h3.turn-head").evaluate_all("hs => hs.map(h => h.id)")
        links = page.locator("nav.outline a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
        assert links == ["#" + t for t in turns] and len(turns) == 4  # the outline links to each turn
        assert page.locator("details.turn-fold[open]").count() == 4  # a short path: every turn open
        write.scroll_into_view_if_needed()
        shot(page, "path-code")


@pytest.mark.slow
def test_every_page_fits_1024_px_and_a_deep_link_is_not_under_the_header(two_runs, tmp_path, browser):  # noqa: F811
    catalog = Catalog.for_log(EventLog(two_runs, "rounds"))
    node = catalog.query(
        "select tree_id, parent_id, count(*) as n from edges group by all order by n desc, parent_id limit 1"
    )[0]
    leaf = catalog.query("select tree_id, leaf_id from paths order by depth desc limit 1")[0]
    deep = catalog.query("select tree_id, node_id from nodes order by depth desc limit 1")[0]
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    narrow = context.new_page()
    try:
        with served(two_runs, tmp_path) as server:
            base = f"{server.base}/t/{server.token}/run/rounds"
            pages = {  # (the compare page last: its box is measured below)
                "collection": f"{server.base}/t/{server.token}/?sort=started&order=desc",
                "attempts": f"{server.base}/t/{server.token}/search?show=attempts&run=rounds",
                "paths": f"{server.base}/t/{server.token}/search?show=paths&run=rounds&which=selected",
                "run": base,
                "tree": f"{base}/tree/{deep['tree_id']}",
                "path": f"{base}/path?tree={leaf['tree_id']}&leaf={leaf['leaf_id']}",
                "compare": f"{base}/tree/{node['tree_id']}/compare?node={node['parent_id']}",
            }
            for name, url in pages.items():
                narrow.goto(url)
                shot(narrow, f"fit-1024-{name}")
                assert narrow.evaluate(FITS), (name, narrow.evaluate("document.documentElement.scrollWidth"))
            assert narrow.locator(".compare section.attempt").count() == node["n"]
            box = narrow.locator(".compare").evaluate(
                "b => [b.getBoundingClientRect().height, b.scrollWidth, b.clientWidth]"
            )
            assert box[0] <= 800 and (node["n"] < 4 or box[1] > box[2])  # its own scroll box, its scrollbar in view
            narrow.goto(f"{pages['tree']}#node-{deep['node_id']}")
            narrow.wait_for_timeout(200)
            row = narrow.locator(f'[id="node-{deep["node_id"]}"]').bounding_box()
            header = narrow.locator("table.nodes thead th").first.bounding_box()
            assert row["y"] >= header["y"] + header["height"] - 1, (row, header)
            narrow.screenshot(path="/tmp/web-shots/fit-1024-deep-link.png")
    finally:
        context.close()


def test_a_malformed_call_is_shown_as_its_arguments():
    from engine.web.pages import _call

    for function in (None, "write", {}, {"name": "write"}, {"name": "write", "arguments": "{not json"}):
        assert _call(function)["kind"] is None  # shown as before: its arguments' text (none: "None")
    for args in ({"content": 3}, [1], {"oldString": "a"}, {"oldString": None, "newString": "b"}):
        for name in ("write", "edit"):
            assert _call({"name": name, "arguments": json.dumps(args)})["kind"] is None
    edit = _call({"name": "edit", "arguments": json.dumps(EDIT)})
    assert (edit["removed"], edit["added"]) == (["TILE = 32", "STEP = 1"], ["TILE = 64", "STEP = 2", "# done"])
    assert json.loads(edit["rest"]) == {"filePath": "/w/solution.py"}
