"""Issue 52's findings on reads: serve's SQL page and ``sql``'s output are bounded in bytes and time, the
token stays with its server, and a bad name in a path is a 404.

``serve`` runs as a user runs it (a process of its own, tests/test_web.py's ``served``); ``sql``
runs as ``python cli.py sql`` in a process of its own, so its memory is its own: the peak is
the kernel's (``os.wait4``), a memory limit the kernel's (``RLIMIT_DATA``, as ``ulimit -d``).
"""

from __future__ import annotations

import http.server
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_query_safety import call
from test_web import browser, page, served, shot, two_runs  # noqa: F401 - fixtures

from engine.web.sql_cells import CELL_CHARS, PAGE_CHARS, SHOWN_COLUMNS

TIME_LIMIT = (
    "Error: the query ran past its time limit of 1 s and was stopped - nothing was written "
    "(give more with --timeout or $TEACHER_MCTS_SQL_TIMEOUT_S)\n"
)


def sql_process(data: Path, *args: str, data_limit: int | None = None) -> tuple[int, Path, str, int]:
    """(exit status, the file of its stdout, stderr, peak RSS in bytes) of ``python cli.py sql ARGS``
    (``data_limit``: its RLIMIT_DATA in bytes)."""

    def limited() -> None:
        if data_limit is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    command = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "sql", *args]
    out, err = data.parent / "sql.out", data.parent / "sql.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=ROOT, preexec_fn=limited)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # (reaped above: Popen must not wait for it again)
    return proc.returncode, out, err.read_text(), usage.ru_maxrss * 1024


def rss(pid: int) -> int:
    """The process's resident memory now, in bytes."""
    found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(found[1]) * 1024


class Sampled:
    """The peak RSS of a process, sampled every 10 ms from a thread until ``stop``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._done = pid, rss(pid), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, rss(self.pid))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def shown_page(server, form: dict) -> tuple[int, str]:
    status, _, body = call(server, "/sql", form)
    return status, body.decode()


def count_line(text: str) -> str:
    return re.search(r'id="sql-count">([^<]*)', text)[1]


# ------------------------------------------------------------------ 5: serve's SQL page


@pytest.mark.slow
def test_a_page_of_long_values_keeps_the_server_small(two_runs, tmp_path):  # noqa: F811
    """The finding as found: 501 values of 2 MB took the server from 100 MB to 5 GB. DuckDB cuts them; the page
    holds 500 cut values, and the server's memory, sampled while it answers, stays near where it was."""
    with served(two_runs, tmp_path) as server:
        assert call(server, "/sql", {"q": "select 1"})[0] == 200  # (the collection read once)
        before = rss(server.proc.pid)
        sampled = Sampled(server.proc.pid)
        status, text = shown_page(server, {"q": "select repeat('x', 2000000) as s from range(501)"})
        peak = sampled.stop()
        assert status == 200, text
        assert peak - before < 300 * 2**20, f"the server grew from {before >> 20} MB to {peak >> 20} MB"
        assert len(text) < 2 * 2**20
        assert count_line(text) == "The first 500 rows shown: the query has more - Download CSV has them all."
        cells = re.findall(r'<td class="cut">(x*)<span class="cut-mark">', text)
        assert cells == ["x" * CELL_CHARS] * 500


@pytest.mark.slow
def test_the_sql_page_shows_long_values_cut_and_one_whole_on_a_click(two_runs, tmp_path, page):  # noqa: F811
    query = "select i, repeat('ab', 300 + i) as t, [i, 7] as l, 'short' as s from range(3) as t(i)"
    with served(two_runs, tmp_path) as server:
        page.goto(f"{server.base}/t/{server.token}/sql")
        page.fill("#q", query)
        page.click("form.sql button.run")
        assert page.locator("#sql-count").inner_text() == "3 rows."
        assert page.locator("#sql-cut").inner_text() == (
            f"3 values longer than {CELL_CHARS} characters shown cut: "
            '"show all" shows one whole (runs the query again).'
        )
        cells = [[td.inner_text() for td in tr.locator("td").all()] for tr in page.locator("table.result tr").all()[1:]]
        for i, (n, t, lst, s) in enumerate(cells):
            assert (n, lst, s) == (str(i), f"[{i}, 7]", "short")  # short values as they are
            assert t == "ab" * (CELL_CHARS // 2) + f"... show all {600 + 2 * i:,} characters"
        shot(page, "sql-cut")
        page.locator("button.show-all").nth(1).click()
        page.wait_for_selector("#sql-whole")
        shot(page, "sql-whole")
        assert page.locator("#sql-whole-head").inner_text() == "t, row 2: 602 characters"
        assert page.locator("#sql-whole").inner_text() == "ab" * 301
        assert page.locator("#q").input_value() == query  # the form keeps the query
        # A cell that is no longer the value shown (the query edited since) says so; it never shows another.
        status, text = shown_page(server, {"q": query.replace("'ab'", "'ba'"), "cell": "1:1:602:" + "0" * 16})
        assert status == 400
        assert "row 2, column 2 of the query&#39;s result is not the value shown before" in text
        assert shown_page(server, {"q": query, "cell": "1:x"})[0] == 400


@pytest.mark.slow
def test_the_sql_page_stops_rows_at_its_characters_and_columns_at_its_count(two_runs, tmp_path):  # noqa: F811
    wide = ", ".join(f"repeat('y', 400) as c{k}" for k in range(50))  # 20,000 characters a row, none cut
    many = ", ".join(f"{k} as c{k}" for k in range(SHOWN_COLUMNS + 50))
    with served(two_runs, tmp_path) as server:
        status, text = shown_page(server, {"q": f"select i, {wide} from range(1000) as t(i)"})
        assert status == 200, text
        rows = chars = 0
        while chars + 50 * 400 + len(str(rows)) <= PAGE_CHARS:  # (every value counts, as shown)
            chars, rows = chars + 50 * 400 + len(str(rows)), rows + 1
        assert count_line(text) == (
            f"The first {rows} rows shown: a page holds {PAGE_CHARS:,} characters of values - "
            "Download CSV has them all."
        )
        assert len(re.findall(r"<tr><td>\d+</td>", text)) == rows
        status, text = shown_page(server, {"q": f"select {many}"})
        assert re.search(r'id="sql-cut">([^<]*)', text)[1] == f"The first {SHOWN_COLUMNS} of 250 columns shown. "
        table = re.search(r'<table class="result">.*?</table>', text, re.S)[0]
        assert table.count("<th>") == SHOWN_COLUMNS and table.count("<td>") == SHOWN_COLUMNS
        status, text = shown_page(server, {"q": "explain select 42"})  # not wrapped: fetched as it is
        assert status == 200 and count_line(text) == "1 row.", text


# ------------------------------------------------------- 5: sql's output streams within its limits


@pytest.mark.slow
def test_sql_stops_a_result_of_long_values_at_its_time_limit_in_little_memory(two_runs):  # noqa: F811
    """2 GB of CSV (100,000 values of 20 KB): fetched and formatted a few rows at a time, the time limit is
    checked between them, and the process holds a few of them (it held 10,000 at a time: 1.5 GB, and ran
    on 14 s past its limit of 1 s)."""
    started = time.monotonic()
    status, out, err, peak = sql_process(
        two_runs, "--csv", "--timeout", "1", "select repeat('x', 20000) as s from range(100000)"
    )
    assert (status, out.stat().st_size, err) == (1, 0, TIME_LIMIT)
    assert peak < 800 * 2**20, f"sql took {peak >> 20} MB"
    assert time.monotonic() - started < 120  # (generous: the process's start and end on a busy machine)


@pytest.mark.slow
def test_sql_prints_a_wide_result_within_a_memory_limit(two_runs):  # noqa: F811
    """400 MB of table under a data limit of 640 MB (``ulimit -d``): the table was held whole to lay it out and
    ended in a MemoryError traceback; its cells now go to a temporary file past a few MB. A value the process
    cannot hold at all: one line saying so."""
    query = "select repeat('x', 1000) as s, i from range(400000) as t(i)"
    status, out, err, _ = sql_process(two_runs, query, data_limit=640 * 2**20)
    assert (status, err) == (0, ""), err
    with out.open() as lines:
        assert next(lines) == "s" + " " * 999 + "  i\n"
        count, last = 1, None
        for last in lines:  # noqa: B007 - the last line is the one wanted
            count += 1
    assert count == 400_001 and last == "x" * 1000 + "  399999\n"
    status, out, err, _ = sql_process(two_runs, "select repeat('x', 600000000) as s", data_limit=640 * 2**20)
    assert (status, out.stat().st_size) == (1, 0), err
    assert err.startswith("Error: the query needed more memory than this process could get"), err
    assert "Traceback" not in err and err.count("\n") == 1


# ------------------------------------------------------------ 7: the token stays with its server


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # the standard library's name
        _Recorder.seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>another service</title><p>another local service</p>")

    def log_message(self, *_args) -> None:
        pass


@pytest.mark.slow
def test_the_token_reaches_no_other_local_service(two_runs, tmp_path, page):  # noqa: F811
    """Cookies do not tell ports apart: a cookie of the server went to every service on 127.0.0.1 the browser
    visited. The browser keeps nothing another port's page receives or reads; deep links work."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with served(two_runs, tmp_path) as server:
            page.goto(f"{server.base}/?token={server.token}")  # the address of before: under the token's prefix
            assert page.url == f"{server.base}/t/{server.token}/"
            deep = f"{server.base}/t/{server.token}/run/rounds/tree/T001#node-T001"
            page.goto(deep)
            assert page.locator("tbody.node").count() > 1
            assert page.context.cookies() == []
            page.goto(f"http://127.0.0.1:{other.server_address[1]}/")
            assert page.locator("p").inner_text() == "another local service"
            assert page.evaluate("localStorage.length") == 0
            sent = _Recorder.seen[-1]
            assert server.token not in repr(sent) and "Cookie" not in sent, sent
            # A fresh browser opens a deep link as it was copied.
            fresh = page.context.browser.new_context()
            try:
                opened = fresh.new_page()
                opened.goto(deep)
                assert opened.locator("tbody.node").count() > 1
            finally:
                fresh.close()
    finally:
        other.shutdown()
        other.server_close()


# ---------------------------------------------------------------- 8: a bad name in a path is 404


@pytest.mark.slow
def test_a_bad_name_in_a_path_is_not_found(two_runs, tmp_path):  # noqa: F811
    with served(two_runs, tmp_path) as server:
        for path in (
            "/run/a..b",
            "/run/a..b/tree/T001",
            "/run/a..b/live",
            "/run/%2e%2e",
            "/run/a..b/path?tree=T&leaf=L",
        ):
            status, _, body = call(server, path)
            assert status == 404, (path, status)
            assert "is not a run&#39;s name" in body.decode(), path
        status, _, body = call(server, "/campaign/a..b")
        assert status == 404 and "is not a campaign&#39;s name" in body.decode()
        status, _, body = call(server, "/run/a..b/events")
        assert status == 404 and body.decode().startswith("no such run: 'a..b' is not a run's name")
        assert server.proc.poll() is None and "Traceback" not in server.log.read_text()
