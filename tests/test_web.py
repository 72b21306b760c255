"""The web app (``serve``) in a real browser: Playwright driving the system Chromium.

Each test starts ``python cli.py serve`` as a process of its own on a free port and
waits until it answers; the browser opens the address with the token the server printed
(every page is under it: engine/web/gate.py); pages are read through the DOM. A screenshot of each page goes
to /tmp/web-shots/.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, SNAPSHOTS, copy_run
from fake_model import FakeModel
from playwright.sync_api import expect, sync_playwright
from test_opencode_e2e import coral_on_path, explore_opencode, roots, script, student, value_for  # noqa: F401 - fixtures

from cli import cli
from engine.catalog import Catalog
from engine.web.pages import _num
from ingest.log import EventLog

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/web-shots")
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.HTTPError:
        return True  # it answered (a refusal is an answer)
    except OSError:
        return False
    return True


def _preparing(url: str) -> bool:
    """Whether the collection page at ``url`` says the collection is still being opened."""
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            return 'id="preparing"' in answer.read().decode()
    except urllib.error.HTTPError:
        return False  # (an answer of its own: the test looks at it)


@dataclass
class Served:
    base: str  # http://127.0.0.1:PORT
    token: str  # the token the server printed
    proc: subprocess.Popen
    log: Path  # its stdout and stderr


@contextmanager
def served(data: Path, tmp: Path, host: str = "127.0.0.1", env: dict[str, str] | None = None, kept: bool = False):
    """A ``serve`` process over ``data`` (``env``: added to its environment), once it answers; with a token of
    its own (``--token``), or (``kept``) the one kept for ``data`` in the user's config directory."""
    port = _free_port()
    log = tmp / f"serve-{port}.log"
    token = [] if kept else ["--token", secrets.token_urlsafe(24)]
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "serve", "--port", str(port), "--host", host]
            + token,
            stdout=fh,
            stderr=fh,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _answers(base + "/static/app.css"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not answer within 120 s:\n" + log.read_text()
            time.sleep(0.1)
        found = re.search(r"/t/([A-Za-z0-9_-]+)/", log.read_text())
        assert found, "the server printed no token:\n" + log.read_text()
        deadline = time.monotonic() + 300
        while _preparing(f"{base}/t/{found[1]}/"):  # (its first opening of the collection, in the background)
            assert time.monotonic() < deadline, "the collection did not open within 300 s:\n" + log.read_text()
            time.sleep(0.1)
        yield Served(base, found[1], proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def serving(data: Path, tmp: Path, host: str = "127.0.0.1"):
    """A ``serve`` process over ``data``: yields (base address, the token it printed)."""
    with served(data, tmp, host) as server:
        yield server.base, server.token


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing (apt install chromium): the tests drive the system browser")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield context.new_page()
    context.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


SHOWN = """(selector) => [...document.querySelectorAll(selector)].map(m => ({
  role: m.dataset.role,
  content: [...m.querySelectorAll(':scope > pre.content, :scope > details > pre.content')]
    .map(p => p.textContent).join(''),
  reasoning: (m.querySelector('pre.reasoning-text') || {}).textContent ?? null,
  tool_call_id: m.dataset.toolCallId ?? null,
  calls: [...m.querySelectorAll('.call')].map(c => [c.dataset.callId, c.querySelector('.call-name').textContent,
                                                    c.querySelector('pre.args').textContent]),
}))"""


def shown_messages(page, selector: str = ".conversation .msg") -> list[dict]:
    """The conversation the page shows, message by message (arguments parsed: shown indented)."""
    shown = page.evaluate(SHOWN, selector)
    for m in shown:
        m["calls"] = [[i, n, json.loads(a)] for i, n, a in m["calls"]]
    return shown


def sample_messages(sample: dict) -> list[dict]:
    """The same fields of an exported sample's messages."""
    out = []
    for m in sample["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)
        out.append(
            {
                "role": m["role"],
                "content": content or "",
                "reasoning": m.get("reasoning_content") or None,
                "tool_call_id": m.get("tool_call_id"),
                "calls": [
                    [c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])]
                    for c in m.get("tool_calls") or []
                ],
            }
        )
    return out


def exported(data: Path, run_id: str, out: Path) -> dict[tuple[str, str], dict]:
    """The run's exported chat samples by (tree, leaf)."""
    r = CliRunner().invoke(cli, ["--data", str(data), "export", run_id, "--out", str(out)])
    assert r.exit_code == 0, r.output
    samples = [json.loads(line) for line in (out / f"{run_id}.chat.jsonl").read_text().splitlines()]
    return {(s["metadata"]["tree_id"], s["metadata"]["leaf_id"]): s for s in samples}


def _path_of(url: str) -> tuple[str, str]:
    from urllib.parse import parse_qs, urlparse

    query = parse_qs(urlparse(url).query)
    return query["tree"][0], query["leaf"][0]


@pytest.fixture
def two_runs(runs, tmp_path) -> Path:
    """The session's runs ``rounds`` and ``async`` alone, in a data dir of their own (other tests may
    add runs to the session's)."""
    data = tmp_path / "two"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)
    return data


@pytest.mark.slow
def test_navigate_collection_run_tree_path_shows_the_exported_sample(two_runs, tmp_path, page):
    runs = two_runs
    samples = exported(runs, "rounds", tmp_path / "out")
    with serving(runs, tmp_path) as (base, token):
        page.goto(f"{base}/?token={token}")
        assert page.locator("table.runs tbody tr").count() == 2  # rounds and async
        shot(page, "collection")
        page.locator("table.runs a", has_text="rounds").click()
        page.wait_for_url(re.compile(r"/run/rounds$"))
        assert page.locator("table.tree-table tbody tr").count() == 4
        assert page.locator("svg.tree").count() == 4  # the report's drawings
        shot(page, "run")
        page.locator("table.tree-table a", has_text="T001").click()
        page.wait_for_url(re.compile(r"/run/rounds/tree/T001$"))
        node = page.locator("tbody.node").nth(1)
        node.locator("button.open").click()  # a node opens its two turns
        assert node.locator(".turn").count() == 2
        # The tree's preference pairs, chosen beside rejected, as export --format dpo writes them.
        done = CliRunner().invoke(
            cli, ["--data", str(runs), "export", "rounds", "--format", "dpo", "--out", str(tmp_path / "pairs")]
        )
        assert done.exit_code == 0, done.output
        pairs = [json.loads(line) for line in (tmp_path / "pairs" / "rounds.dpo.jsonl").read_text().splitlines()]
        pairs = [p for p in pairs if p["metadata"]["tree_id"] == "T001"]
        rows = page.locator("table.pairs tbody tr")
        assert rows.count() == len(pairs) > 0
        cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
        assert [(c[0], c[2], c[6]) for c in cells] == [
            (p["metadata"]["node_id"], p["metadata"]["chosen"]["edge_id"], p["metadata"]["rejected"]["edge_id"])
            for p in pairs
        ]
        shot(page, "tree")
        # Its paths with what their turns cost (cost_paths), a column's name sorting them.
        catalog = Catalog.for_log(EventLog(runs, "rounds"))
        costs = catalog.query("select leaf_id, tokens from cost_paths where tree_id = 'T001'")
        table = page.locator("form.compare-paths table.paths")

        def column(name: str) -> list[str]:
            k = table.locator("thead th").all_inner_texts().index(name)
            return [row.locator("td").nth(k).inner_text() for row in table.locator("tbody tr").all()]

        shown = dict(zip(column("leaf_id"), column("tokens"), strict=True))
        assert {leaf: int(v.replace(",", "")) for leaf, v in shown.items() if v != "-"} == {
            r["leaf_id"]: r["tokens"] for r in costs
        }
        for order in (sorted, lambda xs: sorted(xs, reverse=True)):
            table.locator("thead th", has_text="tokens").click()
            tokens = [int(v.replace(",", "")) for v in column("tokens") if v != "-"]
            assert tokens == order(tokens) and column("tokens")[len(tokens) :] == ["-"] * (len(shown) - len(tokens))
        # Two selected paths side by side from where their conversations part, each as export writes it.
        boxes = page.locator('form.compare-paths input[name="leaf"]')
        assert boxes.count() >= 2
        picked = [boxes.nth(i).get_attribute("value") for i in (0, 1)]
        boxes.nth(0).check()
        boxes.nth(1).check()
        page.locator("form.compare-paths button").click()
        page.wait_for_url(re.compile(r"/run/rounds/tree/T001/paths\?leaf="))
        a, b = (samples[("T001", leaf)]["messages"] for leaf in picked)
        shared = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
        assert page.locator("details.fork summary").inner_text().startswith(f"The conversation they share: {shared} ")
        for k, leaf in enumerate(picked, 1):
            rest = {"messages": samples[("T001", leaf)]["messages"][shared:]}
            assert page.locator(f"#p{k}").get_attribute("data-leaf") == leaf
            assert shown_messages(page, f"#p{k} .msg") == sample_messages(rest)
        shot(page, "compare-paths")
        page.goto(f"{base}/t/{token}/run/rounds/tree/T001")
        # A pair's node compares its attempts side by side, each as export --format kto writes it.
        node_id = next(c[0] for c in cells if {c[3], c[7]} & {"retry", "pruned"})  # a failed attempt in a pair
        page.locator("table.pairs a", has_text=node_id).first.click()
        page.wait_for_url(re.compile(r"/run/rounds/tree/T001/compare\?node="))
        done = CliRunner().invoke(
            cli, ["--data", str(runs), "export", "rounds", "--format", "kto", "--out", str(tmp_path / "labels")]
        )
        assert done.exit_code == 0, done.output
        labels = [json.loads(x) for x in (tmp_path / "labels" / "rounds.kto.jsonl").read_text().splitlines()]
        labels = [r for r in labels if (r["metadata"]["tree_id"], r["metadata"]["node_id"]) == ("T001", node_id)]
        columns = page.locator("section.attempt")
        assert columns.count() == len(labels) >= 2
        shown = {
            columns.nth(i).get_attribute("data-edge"): columns.nth(i).get_attribute("id")
            for i in range(columns.count())
        }
        for row in labels:
            k = shown[row["metadata"]["attempt"]["edge_id"]]
            assert k == row["metadata"]["attempt"]["edge_id"].rsplit("/", 1)[1]  # e<slot>-<attempt>
            assert shown_messages(page, f"#{k} .msg") == sample_messages({"messages": row["completion"]})
        shot(page, "compare")
        # A deep link opens the page with its message in view and marked: the first column's last message,
        # named by its index in the conversation (the prompt's messages, then the attempt's).
        first = columns.nth(0).get_attribute("id")
        forked = [m for m in labels[0]["prompt"] if m["role"] != "system"]  # (every attempt's prompt: the node's)
        last = f"#{first}-m{len(forked) + page.locator(f'#{first} .msg').count() - 1}"
        where = "e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom]"
        assert page.locator(last).evaluate(where)[0] > page.viewport_size["height"]  # below the fold at first
        page.goto(page.url + last)
        assert "#" + page.evaluate("document.querySelector(':target').id") == last
        top, bottom = page.locator(last).evaluate(where)
        assert bottom > 0 and top < page.viewport_size["height"]  # scrolled into view
        page.goto(f"{base}/t/{token}/run/rounds/tree/T001")
        page.locator("table.nodes a", has_text="#1").first.click()
        page.wait_for_url(re.compile(r"/run/rounds/path\?"))
        shot(page, "path")
        key = _path_of(page.url)
        assert key in samples
        assert shown_messages(page) == sample_messages(samples[key])
        # A message's link: the path's last message, scrolled to and marked.
        last = f"#m{len(samples[key]['messages']) - 1}"
        assert page.locator(last).evaluate(where)[0] > page.viewport_size["height"]
        page.goto(page.url + last)
        assert "#" + page.evaluate("document.querySelector(':target').id") == last
        top, bottom = page.locator(last).evaluate(where)
        assert bottom > 0 and top < page.viewport_size["height"]
        # A tool result links to the call it answers: the call is scrolled to and marked.
        result = page.locator('.msg[data-role="tool"]').last
        call_id = result.get_attribute("data-tool-call-id")
        result.locator(".who a", has_text=call_id).click()
        assert page.evaluate("document.querySelector(':target').dataset.callId") == call_id
        top, bottom = page.locator(".call:target").evaluate(where)
        assert bottom > 0 and top < page.viewport_size["height"]
        # The path's fields beside it.
        assert page.locator("table.fields").inner_text().count(samples[key]["metadata"]["selection_id"]) == 1


@pytest.mark.slow
def test_a_run_written_while_the_page_is_open_updates_it_until_it_ends(tmp_path, page):
    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "slow.toml"
    config.write_text("[tree]\ntarget_good_leaves = 2\n[backend_options]\nlatency_s = 0.05\n")
    with serving(data, tmp_path) as (base, token):
        page.goto(f"{base}/run/live?token={token}")
        assert "no run live under" in page.locator("#live").inner_text()  # unknown yet, and followed
        # Every state the page shows (its log prefix), and a mark a reload would lose.
        page.evaluate("""() => { window.__mark = 'same page'; window.__seqs = [];
            const live = document.getElementById('live');
            new MutationObserver(() => { const s = live.querySelector('.live-section');
                if (s) window.__seqs.push(s.dataset.seq); }).observe(live, {childList: true}); }""")
        writer = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "--data",
                str(data),
                "explore",
                str(SNAPSHOTS),
                "--select",
                "--task",
                "kernel-speedup",
                "--num-roots",
                "2",
                "--run-id",
                "live",
                "--config",
                str(config),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            page.wait_for_selector('.live-section[data-finished="false"] table.tree-table', timeout=240_000)
            shot(page, "run-live")
            page.wait_for_selector('.live-section[data-finished="true"]', timeout=300_000)
        finally:
            _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err.decode()
        assert page.evaluate("window.__mark") == "same page"
        from ingest.log import EventLog

        seqs = page.evaluate("window.__seqs")
        assert seqs[-1] == str(EventLog(data, "live").tail_seq())  # the final state
        assert len(set(seqs)) >= 2, seqs  # and states before it
        assert page.locator("table.tree-table tbody tr").count() == 2
        assert "finished" in page.locator(".summary .status").inner_text()
        assert page.locator("svg.tree").count() == 2
        shot(page, "run-finished")


def _hand_run_with(data: Path, payload: str) -> str:
    """tests/hand_run.py's run, a tool result of its first turn replaced by ``payload``."""
    import hand_run

    from engine.catalog import Catalog
    from engine.selections import default_parameters, selection_decision
    from ingest.events import ConversationRecorded, RunFinished, RunStarted
    from ingest.log import EventLog, LogWriter

    def patched(event):
        if isinstance(event, ConversationRecorded):
            messages = [
                m | {"content": payload} if m.get("content") == "Tiles of 64 were best." else m for m in event.messages
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
def test_html_in_a_tool_result_is_shown_as_text(tmp_path, page):
    data = tmp_path / "data"
    _hand_run_with(data, PAYLOAD)
    samples = exported(data, "hand", tmp_path / "out")
    with serving(data, tmp_path) as (base, token):
        page.goto(f"{base}/run/hand/path?tree=T1&leaf=T1.1.1&token={token}")
        shot(page, "path-escaped")
        assert page.evaluate("window.__pwned") is None  # no script ran
        assert page.locator(".conversation img").count() == 0 and page.locator(".conversation script").count() == 0
        results = page.locator('.msg[data-role="tool"] pre.content').all_inner_texts()
        assert PAYLOAD in results
        assert shown_messages(page) == sample_messages(samples[("T1", "T1.1.1")])


DEEP = """parallel = 1
[tree]
root_children = 1
max_children = 1
max_depth = 50
hard_token_limit = 1000000000000
target_good_leaves = 1
max_valid_edges = 1000
max_failed_expansions = 1000
tool_error_prune = 1.0
[backend_options]
latency_s = 0
"""


@pytest.mark.slow
def test_a_100_turn_path_renders_whole(tmp_path, page):
    """A path of 50 edges (100 turns, over a thousand messages) on one page, equal to its export."""
    config = tmp_path / "deep.toml"
    config.write_text(DEEP)
    data = tmp_path / "data"
    args = ["--data", str(data), "explore", str(SNAPSHOTS), "--select", "--task", "kernel-speedup"]
    done = CliRunner().invoke(cli, [*args, "--num-roots", "1", "--run-id", "deep", "--config", str(config)])
    assert done.exit_code == 0, done.output
    samples = exported(data, "deep", tmp_path / "out")
    leaf = "T001" + ".1" * 50
    assert set(samples) == {("T001", leaf)}
    with serving(data, tmp_path) as (base, token):
        page.goto(f"{base}/run/deep/path?tree=T001&leaf={leaf}&token={token}")
        assert page.locator(".conversation .turn-head").count() == 100
        assert page.locator("details.turn-fold:not([open])").count() == 100  # folded, the outline to jump:
        assert page.locator("nav.outline a").count() == 100  # (issue 54)
        page.locator("p.failures a.next-failure").click()  # a failure in a folded turn: its fold opens
        assert page.evaluate("document.querySelector(':target').closest('details.turn-fold').open")
        assert page.locator(".conversation .eval").count() == 100
        assert shown_messages(page) == sample_messages(samples[("T001", leaf)])
        assert len(samples[("T001", leaf)]["messages"]) > 1000
        shot(page, "path-100-turns")


def _planted(data: Path, run_id: str, needle: str) -> list[tuple[str, int]]:
    """An independent count: (edge, index) of each turn's own tool message holding ``needle``, read from the log."""
    found = []
    for batch in EventLog(data, run_id).scan_kind(
        "conversation_recorded", ["edge_id", "base", "turn_start", "messages"]
    ):
        for row in batch.to_pylist():
            for i, m in enumerate(json.loads(row["messages"]), row["base"]):
                if (
                    i >= row["turn_start"]
                    and m.get("role") == "tool"
                    and needle.lower() in str(m.get("content")).lower()
                ):
                    found.append((row["edge_id"], i))
    return found


@pytest.mark.slow
def test_a_search_finds_a_string_planted_in_one_tool_result_and_opens_its_message(two_runs, tmp_path, page):
    needle = "Needle-7F3A"
    _hand_run_with(two_runs, f"{PAYLOAD} the {needle} is here")
    planted = _planted(two_runs, "hand", needle)
    assert planted  # (the hand run reads the note once or more)
    with serving(two_runs, tmp_path) as (base, token):
        page.goto(f"{base}/?token={token}")
        page.locator("nav.top a", has_text="search").click()
        page.fill("#q", needle.lower())  # upper or lower case alike
        page.locator("form.search button").click()
        page.wait_for_url(re.compile(r"/search\?q="))
        shot(page, "search")
        assert page.evaluate("window.__pwned") is None and page.locator("table.hits img").count() == 0
        assert (
            page.locator("#search-count")
            .inner_text()
            .startswith(f"{len(planted)} hit{'' if len(planted) == 1 else 's'} in ")
        )
        hits = page.locator("table.hits tbody tr")
        assert hits.count() == len(planted)
        assert {hits.nth(i).locator("td").nth(0).inner_text() for i in range(hits.count())} == {"hand"}
        assert page.locator("table.hits mark").first.inner_text() == needle
        # Filters narrow it: another run has none; a verdict no attempt with it has.
        page.goto(f"{base}/t/{token}/search?q={needle}&run=rounds")
        assert page.locator("#search-count").inner_text() == "0 hits."
        # Its link opens the message on its node's compare page, scrolled to and marked.
        page.goto(f"{base}/t/{token}/search?q={needle}")
        edge_id, index = planted[0]
        page.locator("table.hits a.hit").first.click()
        page.wait_for_url(re.compile(r"/run/hand/tree/T1/compare\?node=.*#e\d+-\d+-m\d+$"))
        target = page.evaluate("document.querySelector(':target').id")
        assert target == f"{edge_id.rsplit('/', 1)[1]}-m{index}"
        marked = page.locator(f"#{target}")
        assert needle in marked.inner_text() and marked.get_attribute("data-role") == "tool"
        top, bottom = marked.evaluate("e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom]")
        assert bottom > 0 and top < page.viewport_size["height"]
        assert page.evaluate("window.__pwned") is None
        shot(page, "search-opened")


@pytest.mark.slow
def test_a_non_local_bind_refuses_requests_without_its_token(two_runs, tmp_path, page):
    runs = two_runs
    with serving(runs, tmp_path, host="0.0.0.0") as (base, token):
        assert token, "the server printed no token"
        for path in ("/", "/sql?q=select+1", "/run/rounds", "/run/rounds/events", "/static/app.css"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 403
            assert b"needs its token" in refused.value.read()
        for wrong in (f"{base}/?token={token}x", f"{base}/t/{token}x/", f"{base}/t/{token[:-1]}/run/rounds"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(wrong, timeout=30)
            assert refused.value.code == 403
        page.goto(f"{base}/?token={token}")  # the address of before: the same page under the token's prefix
        assert page.url == f"{base}/t/{token}/"
        assert page.locator("table.runs tbody tr").count() == 2
        page.goto(base + "/run/rounds")  # typed without the token: the gate page forwards it under the prefix
        page.wait_for_url(f"{base}/t/{token}/run/rounds")
        assert page.locator("svg.tree").count() == 4


@pytest.mark.slow
def test_the_sql_page_refuses_a_write_with_the_sandboxs_message(two_runs, tmp_path, page):
    runs = two_runs
    from engine.catalog.queries import RefusedQueryError, check_query
    from engine.collection import open_runs

    with pytest.raises(RefusedQueryError) as refused:
        check_query("delete from nodes")
    query = "select run_id, tree_id, node_id, score from nodes where depth = 1 order by run_id, node_id"
    expected = open_runs(runs).query(query)
    with serving(runs, tmp_path) as (base, token):
        page.goto(f"{base}/sql?token={token}")
        page.fill("#q", "delete from nodes")
        page.click("form.sql button.run")
        assert page.locator("#sql-error").inner_text() == str(refused.value)
        assert page.locator("table.result").count() == 0
        shot(page, "sql-refused")
        page.fill("#q", query)
        page.click("form.sql button.run")  # (a form: the result is a new page, waited for)
        expect(page.locator("table.result tbody tr")).to_have_count(len(expected), timeout=120_000)
        assert page.locator("#sql-count").inner_text() == f"{len(expected)} rows."
        assert page.locator("table.views a.view").count() > 50  # every view, with its summary
        shot(page, "sql")
        with page.expect_download() as download:
            page.click("form.sql button.csv")
        csv_text = Path(download.value.path()).read_text()
        # A view's name puts a query of it in the box, run only when asked.
        page.locator("table.views a.view", has_text="run_config").click()
        page.wait_for_url(re.compile(r"/sql\?q="))
        assert page.locator("#q").input_value() == "select * from run_config limit 100"
        assert page.locator("table.result").count() == 0
        page.click("form.sql button.run")
        expect(page.locator("table.result tbody tr")).to_have_count(2, timeout=120_000)
    lines = csv_text.splitlines()
    assert lines[0] == "run_id,tree_id,node_id,score"
    assert [line.split(",")[2] for line in lines[1:]] == [r["node_id"] for r in expected]


@pytest.mark.slow
def test_a_recorded_opencode_run_shows_what_export_writes(tmp_path, page, roots, student, coral_on_path):  # noqa: F811
    model = FakeModel(script).start()
    config = tmp_path / "run.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 2\nmax_children = 1\nmax_depth = 2\n")
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "oc", "--coral-dir", str(student))
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    samples = exported(data, "oc", tmp_path / "out")
    catalog = Catalog.for_log(EventLog(data, "oc"))
    attempts = {e["edge_id"]: e for e in catalog.query("select * from edges where parent_id = 'T001'")}
    assert sorted(e["verdict"] for e in attempts.values()) == ["kept", "kept", "retry"]  # e1-1 crashed: retried
    with serving(data, tmp_path) as (base, token):
        page.goto(f"{base}/run/oc?token={token}")
        page.locator("details.paths a", has_text="T001.1.1").click()
        page.wait_for_url(re.compile(r"/run/oc/path\?"))
        shot(page, "path-opencode")
        sample = samples[("T001", "T001.1.1")]
        assert shown_messages(page) == sample_messages(sample)
        assert page.locator(".eval").count() == 4  # each turn's eval after its last message
        # Each eval's result as the path's turns record it; the code the model wrote (a write call) shown as code.
        turns = {(t["edge_id"], t["turn"]): t for t in sample["metadata"]["turns"]}
        for shown in page.locator(".conversation .eval").all():
            t = turns[(shown.get_attribute("data-edge"), int(shown.get_attribute("data-turn")))]
            assert (f"score {_num(t['score'])}" if t["score"] is not None else "no score") in shown.inner_text()
            assert (t["eval_status"] or "no status") in shown.inner_text()
        wrote = [
            json.loads(c["function"]["arguments"])["content"]
            for m in sample["messages"]
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "write"
        ]
        code = page.locator(".conversation .call pre.code-block").all_inner_texts()
        assert wrote and [c.strip() for c in code] == [w.strip() for w in wrote]
        assert not any("\\n" in c for c in code)  # real lines, not a JSON string's escapes
        # Every leaf link of every tree page answers 200 (selected or not).
        for tree in sorted({r["tree_id"] for r in catalog.query("select tree_id from paths")}):
            page.goto(f"{base}/t/{token}/run/oc/tree/{tree}")
            leaves = page.locator("table.paths tbody a").evaluate_all("as => as.map(a => a.href)")
            assert len(leaves) == catalog.query("select count(*) as n from paths where tree_id = ?", [tree])[0]["n"]
            for href in leaves:
                assert page.request.get(href).status == 200, href
        # The root's attempts side by side: where they differ, and the code each changed (git, in the
        # tree's repository: from the root's commit to the attempt's last turn's).
        page.goto(f"{base}/t/{token}/run/oc/tree/T001")
        root_row = page.locator("tbody.node").nth(0)
        root_row.locator("button.open").click()
        root_row.locator("a.compare-link").click()
        page.wait_for_url(re.compile(r"/run/oc/tree/T001/compare\?node=T001$"))
        shot(page, "compare-opencode")
        columns = page.locator("section.attempt")
        assert sorted(columns.nth(i).get_attribute("data-edge") for i in range(columns.count())) == sorted(attempts)
        # The attempts read the same turn prompt (it ends what they all received) and answered alike at first
        # (the script's two reads, their results): they differ from the model's second answer on.
        assert page.locator("details.fork > summary").inner_text().startswith("What they all received: 2 messages")
        markers = page.locator(".diverge")
        assert markers.count() == 3
        assert {markers.nth(i).inner_text() for i in range(3)} == {
            "The attempts differ from here (their first 3 messages are the same)"
        }
        ends = {
            r["edge_id"]: json.loads(r["state"])
            for r in catalog.query("select edge_id, arg_max(state, turn) as state from stg_turn_finished group by 1")
        }
        repo = ends["T001/e1-1"]["repo"]
        root = subprocess.run(
            ["git", "-C", repo, "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True
        )
        for edge_id in attempts:
            column = page.locator(f'section.attempt[data-edge="{edge_id}"]')
            column.locator("details.code summary").click()
            shown = column.locator("pre.diff").inner_text()
            diff = subprocess.run(
                ["git", "-C", repo, "diff", root.stdout.strip(), ends[edge_id]["commit"]],
                capture_output=True,
                text=True,
            ).stdout
            assert shown.strip() == diff.strip() and "solution.py" in diff
            wrote = value_for(edge_id, 2 if attempts[edge_id]["verdict"] == "kept" else 1)
            assert f"+VALUE = {wrote}" in shown  # the code the model wrote in its last turn
        shot(page, "compare-opencode-diffs")


def test_serve_refuses_a_missing_data_directory(tmp_path):
    r = CliRunner().invoke(cli, ["--data", str(tmp_path / "nowhere"), "serve", "--port", "0"])
    assert r.exit_code == 1
    assert (
        r.stderr == f"Error: {tmp_path / 'nowhere'}: no such directory - give --data the directory that holds "
        "(or will hold) runs/\n"
    )


def test_serve_on_a_port_in_use_is_a_clean_error_before_any_address_is_printed(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = CliRunner().invoke(cli, ["--data", str(tmp_path), "serve", "--port", str(port)])
    assert r.exit_code == 1
    assert r.stderr == f"Error: cannot serve on 127.0.0.1:{port}: Address already in use - choose another with --port\n"


@pytest.mark.slow
def test_a_campaign_page_shows_what_the_campaign_command_printed(tmp_path, page, monkeypatch):
    from test_campaign import campaign_file
    from test_campaign import cli as run_cli

    from engine.collection import Collection
    from engine.web.data import Source, campaign_page

    data = tmp_path / "data"
    printed = json.loads(
        run_cli(data, "campaign", str(campaign_file(tmp_path, "coverage", {"edges": 24})), "--json").stdout
    )
    # The page's summary is the server's collection's answer: no collection (a DuckDB instance) a load.
    runs = Source(data).collection()
    made = []
    monkeypatch.setattr(Collection, "__init__", lambda *a, **k: made.append(a) or pytest.fail("a collection made"))
    summary = campaign_page(data, "camp", runs)["result"].summary
    assert made == [] and [(t["run_id"], t["n"]) for t in summary] == [(t["run_id"], t["n"]) for t in printed["tasks"]]
    monkeypatch.undo()
    with serving(data, tmp_path) as (base, token):
        page.goto(f"{base}/?token={token}")
        page.click("table.campaigns tbody a:text('camp')")  # (a column's name is a link too: it sorts)
        page.wait_for_selector("table.tasks")
        shot(page, "campaign")
        cells = page.evaluate(
            "() => [...document.querySelectorAll('table.tasks tbody tr')]"
            ".map(r => [...r.cells].map(c => c.textContent))"
        )
        assert [(c[0], c[1], int(c[3].replace(",", ""))) for c in cells] == [
            (t["task"], t["run_id"], t["n"]) for t in printed["tasks"]
        ]
        grants = page.evaluate("() => document.querySelectorAll('table.grants tbody tr').length")
        from engine.runset import open_campaign

        assert grants == len(open_campaign(data, "camp").query("select * from campaign_grants"))
        # Round by round, what the runs had spent when the round read them: each run's log loaded up to
        # the round's mark, its campaign_spend read there (as the campaign's replay reads it).
        rounds = open_campaign(data, "camp").query("select seq, marks from campaign_rounds order by seq")
        expected = []
        for r in rounds:
            edges = tokens = 0
            for run_id, mark in json.loads(r["marks"]).items():
                catalog = Catalog.empty()
                catalog.load(EventLog(data, run_id), upto=mark)
                spend = catalog.query("select kept_edges, tokens from campaign_spend")[0]
                edges, tokens = edges + spend["kept_edges"], tokens + spend["tokens"]
            expected.append((r["seq"], edges, tokens))
        shown = page.evaluate(
            "() => [...document.querySelectorAll('table.rounds tbody tr')]"
            ".map(r => [...r.cells].map(c => c.textContent))"
        )
        assert [(int(c[0]), int(c[6].replace(",", "")), int(c[7].replace(",", ""))) for c in shown] == expected
        assert len(expected) >= 2 and expected[-1][1] > expected[0][1]  # (it grew between rounds)
        assert "24 valid edges" in page.locator("p.budget").inner_text()  # the budget beside the spend
        page.click(f"table.tasks a:text('{printed['runs'][0]}')")
        page.wait_for_selector("#live")
        assert printed["runs"][0] in page.title()
    # The campaign bundled by its name (engine/web/bundle.py): its page and its runs' pages open from disk.
    out = tmp_path / "bundle"
    r = CliRunner().invoke(cli, ["--data", str(data), "bundle", "camp", "--out", str(out)])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "bundle.json").read_text())
    assert sorted(manifest["runs"]) == sorted(printed["runs"]) and manifest["campaigns"] == ["camp"]
    page.goto((out / "index.html").as_uri())
    page.click("table.campaigns tbody a:text('camp')")
    page.wait_for_selector("table.tasks")
    page.click(f"table.tasks a:text('{printed['runs'][0]}')")
    page.wait_for_selector("#live")
    assert page.url.startswith("file://") and printed["runs"][0] in page.title()
