"""Issue 33's findings on queries: ``serve`` is safe by default, ``sql --timeout`` bounds the whole
command, and a damaged campaign is one damaged item of ``serve``'s pages.

``serve`` runs as a user runs it (``python cli.py serve``, a process of its own, through
tests/test_web.py's ``served``); requests go over the loopback with urllib and http.client,
pages that are looked at in Chromium. A query that must run long is a recursive CTE (one
row an iteration: it runs for hours, on one core, in little memory); the server's time
limit is set far above every deadline the tests wait with, so a query still running when a
test looks was not stopped by its limit.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from test_web import browser, page, served, shot, two_runs  # noqa: F401 - fixtures

from cli import cli

LONG = "with recursive r(i) as (select 1 union all select i + 1 from r where i < 1e15) select count(*) from r"
ENDLESS = "select i, repeat('x', 1000) as pad from range(1000000000000) as t(i)"  # 10^12 rows of 1 KB
NO_LIMIT_SOON = {"TEACHER_MCTS_SQL_TIMEOUT_S": "900"}
GONE = "serve: a client went away: its query was stopped"


def call(server, path: str, form: dict | None = None, headers: dict | None = None, token: bool = True):
    """(status, headers, body) of a GET (a POST of ``form``), with the server's token unless not ``token``."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    sent = {"Authorization": f"token {server.token}"} if token else {}
    if data is not None:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    request = urllib.request.Request(server.base + path, data=data, headers={**sent, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def started(server, query: str, fmt: str = "page") -> http.client.HTTPConnection:
    """A connection whose POST of ``query`` is sent, its answer not read."""
    conn = http.client.HTTPConnection(server.base.removeprefix("http://"), timeout=120)
    body = urllib.parse.urlencode({"q": query, "format": fmt})
    headers = {"Authorization": f"token {server.token}", "Content-Type": "application/x-www-form-urlencoded"}
    conn.request("POST", "/sql", body, headers)
    return conn


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_for(condition, what: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s:.0f} s"
        time.sleep(0.05)


def running(server, before: float) -> None:
    """Wait until the server has worked a second of CPU since ``before``: the query sent is running."""
    wait_for(lambda: cpu_seconds(server.proc.pid) - before >= 1.0, "the query did not start")


# ------------------------------------------------------------------ 8: serve is safe by default


@pytest.mark.slow
def test_serve_on_the_loopback_needs_its_token(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path) as server:
        for path, form in (("/", None), ("/sql", {"q": "select 1"}), ("/run/rounds", None), ("/static/app.css", None)):
            status, _, body = call(server, path, form, token=False)
            assert status == 403 and b"needs its token" in body, (path, status, body)
        status, _, _ = call(server, "/", headers={"Cookie": f"teacher-mcts-token-1={server.token}"}, token=False)
        assert status == 403  # a cookie opens nothing: the token is in the path or a header
        # The address of before is redirected under the token's prefix, where every page is; no cookie is set.
        cookies = urllib.request.HTTPCookieProcessor()
        opener = urllib.request.build_opener(cookies)
        home = f"{server.base}/t/{server.token}"
        with opener.open(f"{server.base}/?token={server.token}", timeout=120) as response:
            assert response.status == 200 and response.url == home + "/"
            assert f'href="/t/{server.token}/run/rounds"' in response.read().decode()  # its links keep the prefix
        assert list(cookies.cookiejar) == []
        with opener.open(f"{home}/run/rounds", timeout=120) as response:
            assert response.status == 200
        for path in ("/", "/run/rounds"):
            status, _, body = call(server, f"/t/{server.token[:-1]}{path}", token=False)
            assert status == 403 and b"needs its token" in body, (path, status, body)


@pytest.mark.slow
def test_a_get_of_the_sql_page_runs_no_query(two_runs, tmp_path):  # noqa: F811
    query = "select error('this query ran')"
    with served(two_runs, tmp_path) as server:
        for extra in ("", "&format=csv"):
            status, headers, body = call(server, "/sql?q=" + urllib.parse.quote(query) + extra)
            text = body.decode()
            assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, text)
            assert 'id="sql-error"' not in text and 'class="result"' not in text
            assert re.search(
                r'<textarea name="q" id="q"[^>]*>select error\(&#39;this query ran&#39;\)</textarea>', text
            )
        status, _, body = call(server, "/sql", {"q": query})  # the form's POST runs it
        assert status == 400 and "this query ran" in re.search(r'id="sql-error">([^<]*)', body.decode())[1]


@pytest.mark.slow
def test_a_query_sent_by_another_sites_page_is_refused(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path) as server:
        port = server.base.rsplit(":", 1)[1]
        form = {"q": "select 41 + 1 as answer"}
        for headers in (
            {"Origin": "https://evil.example"},
            {"Origin": "http://127.0.0.1:1"},  # another server on this host: same site, another origin
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-site"},
        ):
            status, _, body = call(server, "/sql", form, headers)
            assert status == 403, (headers, status, body)
            assert body.decode().startswith("403: refused - it was sent by a page of "), body
        for headers in (
            {},
            {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
            {"Sec-Fetch-Site": "none"},
        ):
            status, _, body = call(server, "/sql", form, headers)
            assert status == 200 and "<td>42</td>" in body.decode(), (headers, status)


@pytest.mark.slow
def test_a_long_query_does_not_hold_up_other_pages(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path, env=NO_LIMIT_SOON) as server:
        assert call(server, "/")[0] == 200  # the runs read: from now on the server idles
        before = cpu_seconds(server.proc.pid)
        long = started(server, LONG)
        running(server, before)
        for path in ("/", "/run/rounds", "/run/rounds/tree/T001", "/run/rounds/live", "/sql"):
            assert call(server, path)[0] == 200, path
        status, _, body = call(server, "/sql", {"q": "select 41 + 1 as answer"})
        assert status == 200 and "<td>42</td>" in body.decode()
        assert select.select([long.sock], [], [], 0)[0] == []  # the long query has not answered: still running
        long.close()


@pytest.mark.slow
def test_a_query_whose_client_goes_away_is_stopped(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path, env=NO_LIMIT_SOON) as server:
        for fmt in ("page", "csv"):
            before = cpu_seconds(server.proc.pid)
            conn = started(server, LONG, fmt)
            running(server, before)
            notes = server.log.read_text().count(GONE)
            conn.close()  # the client goes away: its query is interrupted, long before its time limit
            wait_for(lambda n=notes: server.log.read_text().count(GONE) == n + 1, "the query was not stopped")
        idle = cpu_seconds(server.proc.pid)
        assert call(server, "/sql", {"q": "select 41 + 1 as answer"})[0] == 200
        assert cpu_seconds(server.proc.pid) - idle < 5  # (nothing left running meanwhile)


@pytest.mark.slow
def test_the_page_fetches_only_the_rows_it_shows(two_runs, tmp_path):  # noqa: F811
    """10^12 rows of a kilobyte: a page that fetched them all would never answer (nor hold them)."""
    with served(two_runs, tmp_path, env={"TEACHER_MCTS_SQL_TIMEOUT_S": "60"}) as server:
        status, _, body = call(server, "/sql", {"q": ENDLESS})
        text = body.decode()
        assert status == 200, text
        assert re.search(r'id="sql-count">([^<]*)', text)[1] == (
            "The first 500 rows shown: the query has more - Download CSV has them all."
        )
        shown = re.search(r'<table class="result">.*?</table>', text, re.S)[0]
        assert re.findall(r"<tr><td>(\d+)</td>", shown) == [str(i) for i in range(500)]
        status, _, body = call(server, "/sql", {"q": "select i from range(500) as t(i)"})
        assert re.search(r'id="sql-count">([^<]*)', body.decode())[1] == "500 rows."


@pytest.mark.slow
def test_the_csv_download_streams_every_row_within_the_time_limit(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path, env={"TEACHER_MCTS_SQL_TIMEOUT_S": "5"}) as server:
        query = "select i, 'row ' || i as s, [i, i + 1] as l from range(25000) as t(i)"  # batches of 2,000 rows
        status, headers, body = call(server, "/sql", {"q": query, "format": "csv"})
        assert status == 200 and headers["Content-Type"] == "text/csv; charset=utf-8"
        assert headers["Content-Disposition"] == 'attachment; filename="query.csv"'
        lines = body.decode().split("\r\n")
        assert lines[0] == "i,s,l" and lines[-1] == "" and len(lines) == 25002
        assert lines[1:-1] == [f'{i},row {i},"[{i}, {i + 1}]"' for i in range(25000)]
        # Endless: its first rows come at once (streamed), then the time limit stops it unfinished.
        conn = started(server, "select i from range(1000000000000) as t(i)", "csv")
        response = conn.getresponse()
        assert response.status == 200
        assert response.read(1 << 20).startswith(b"i\r\n0\r\n1\r\n2\r\n")
        with pytest.raises(http.client.IncompleteRead):  # the client sees a download that failed
            while response.read(1 << 20):
                pass
        conn.close()
        wait_for(
            lambda: (
                "a CSV download stopped unfinished: the query ran past its time limit of 5 s" in server.log.read_text()
            ),
            "the server did not say why",
        )
        # A query's errors before its first row: the page, with the error.
        status, _, body = call(server, "/sql", {"q": "select error('no rows')", "format": "csv"})
        assert status == 400 and "no rows" in re.search(r'id="sql-error">([^<]*)', body.decode())[1]


def test_queries_at_once_each_read_their_own_bindings(two_runs):  # noqa: F811
    """A query's views are bound when it starts (a short lock), and it reads them whatever another query
    binds meanwhile: a page of one run rebinds ``trees`` to that run's file while a query of every run runs."""
    from engine.collection import open_runs

    runs = open_runs(two_runs)
    with runs.result("select count(*) as n from trees") as every:  # bound to both runs' files
        assert runs.query("select count(*) as n from trees", "rounds") == [{"n": 4}]  # rebound to one
        assert every.columns == ["n"] and list(every.batches()) == [[(8,)]]
    assert runs.query("select count(*) as n from trees") == [{"n": 8}]


# ------------------------------------------------------- 9: sql's limits bound the whole command


@pytest.mark.parametrize("fmt", ["text", "--json", "--csv", "--parquet"])
def test_sql_timeout_covers_formatting_and_writing(two_runs, tmp_path, fmt):  # noqa: F811
    """DuckDB makes 20M (parquet: 10^10) rows of a range in no time; formatting them takes longer than
    a second on any machine. Stopped at the limit as a query is, nothing printed or written."""
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "result.parquet"
    rows = 10**10 if fmt == "--parquet" else 20_000_000
    args = {"text": [], "--parquet": ["--parquet", str(out)]}.get(fmt, [fmt])
    r = CliRunner().invoke(
        cli, ["--data", str(two_runs), "sql", f"select i from range({rows}) as t(i)", "--timeout", "1", *args]
    )
    assert r.exit_code == 1, r.output
    assert r.stderr == (
        "Error: the query ran past its time limit of 1 s and was stopped - nothing was written "
        "(give more with --timeout or $TEACHER_MCTS_SQL_TIMEOUT_S)\n"
    )
    assert r.stdout == "" and list(out.parent.iterdir()) == []  # nothing half-written


def test_sql_prints_every_format_as_before(two_runs):  # noqa: F811
    """The batched output is the output of before: a table, one JSON document, CSV (header when empty too)."""
    query = "select i, 'r' || i as s, [i, 7] as l, i / 3 as f from range(3) as t(i)"
    printed = {
        fmt: CliRunner().invoke(cli, ["--data", str(two_runs), "sql", query, *flag]).stdout_bytes.decode()
        for fmt, flag in (("text", []), ("json", ["--json"]), ("csv", ["--csv"]))
    }
    assert printed["text"] == (
        "i  s   l       f\n0  r0  [0, 7]  0.0000\n1  r1  [1, 7]  0.3333\n2  r2  [2, 7]  0.6667\n"
    )
    assert json.loads(printed["json"]) == [{"i": i, "s": f"r{i}", "l": [i, 7], "f": i / 3} for i in range(3)]
    assert printed["json"] == json.dumps(json.loads(printed["json"]), indent=2) + "\n"
    assert printed["csv"] == (
        'i,s,l,f\r\n0,r0,"[0, 7]",0.0\r\n1,r1,"[1, 7]",0.3333333333333333\r\n2,r2,"[2, 7]",0.6666666666666666\r\n'
    )
    empty = CliRunner().invoke(cli, ["--data", str(two_runs), "sql", "select 1 as x where false", "--csv"])
    assert empty.stdout_bytes == b"x\r\n"


# ------------------------------------------------ 7: a damaged campaign is one damaged item


@pytest.mark.slow
def test_a_damaged_campaign_is_named_beside_the_healthy_runs(tmp_path, page):  # noqa: F811
    from test_campaign import campaign_file
    from test_campaign import cli as run_cli

    data = tmp_path / "data"
    run_cli(data, "campaign", str(campaign_file(tmp_path, "coverage", {"edges": 24})))
    record = data / "campaigns" / "runs" / "camp" / "log" / "_record.jsonl"
    record.write_text("garbage, not a record\n")
    with served(data, tmp_path) as server:
        page.goto(f"{server.base}/?token={server.token}")
        shot(page, "collection-damaged-campaign")
        assert page.locator("table.runs tbody tr").count() == 3  # the campaign's runs: healthy
        damaged = page.locator("p.damaged").all_inner_texts()
        assert damaged == [
            f"left out, damaged: campaign camp is damaged and was not read: {record}: line 1 is damaged (not JSON) - "
            f"'python {ROOT / 'cli.py'} --data {data} verify camp' says what is intact"  # (serve ran as that)
        ]
        answer = page.goto(f"{server.base}/t/{server.token}/campaign/camp")
        shot(page, "campaign-damaged")
        assert answer.status == 200
        assert page.locator("h1").inner_text() == "Campaign camp is damaged"
        assert page.locator("#problem").inner_text() == damaged[0].removeprefix("left out, damaged: ")
