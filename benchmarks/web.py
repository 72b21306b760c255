"""Benchmark: the server time of each page of ``serve`` over a collection, against the 300 ms target.

``python cli.py --data DIR serve`` runs as a user runs it, in a process of its own on a
free port; each page is requested once cold (the first request of the server opens the
collection, the path page builds its sample as ``export`` does) and then ``--repeat``
times warm, from this process over the loopback (the HTTP round trip on the loopback
is well under a millisecond, so a request's time is the server's). The run, tree and
path asked for are the first selected path of the collection (read through the SQL
page). Requests carry the token the server printed; SQL is POSTed as its page's form
does. The compare pages (the node with the most attempts, two selected paths of a tree)
and searches of every transcript (issue 37: warm <= 1 s at ~1M events) are among them.
Printed: each page's cold time, its warm median and the target (warm medians <= 300 ms
on the ~10M-event collection, issue 27), and the load average; ``--browser``: the
longest selected path's page in Chromium (the server's time, then the page drawn).

    python benchmarks/web.py --data /tmp/collection-data/1M [--repeat 5] [--browser]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlencode

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 300.0
SEARCH_TARGET_MS = 1000.0  # a search of every transcript at ~1M events (issue 37)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOKEN: dict[str, str] = {}  # the Authorization header of the server's token


def _get(url: str, form: dict[str, str] | None = None) -> tuple[float, bytes]:
    """A page's time (ms) and body: a GET, or a POST of ``form`` (the SQL page's query)."""
    data = None if form is None else urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers=TOKEN)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as response:
        body = response.read()
    return (time.perf_counter() - started) * 1000, body


def _wait(url: str, proc: subprocess.Popen, err: Path) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # it answered (without the token: a refusal)
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the server did not start:\n{err.read_text()}")
            time.sleep(0.2)


def _rows(base: str, query: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_get(f"{base}/sql", {"q": query, "format": "csv"})[1].decode())))


def _compare_pages(base: str) -> list[tuple[str, str]]:
    """The compare page of the node with the most attempts, and the first two selected paths of a tree."""
    pages = []
    node = _rows(
        base,
        "select run_id, tree_id, parent_id, count(*) as n from edges where verdict is not null "
        "group by all order by n desc, run_id, tree_id, parent_id limit 1",
    )
    if node:
        run, tree, parent, n = node[0]["run_id"], node[0]["tree_id"], node[0]["parent_id"], node[0]["n"]
        pages.append(
            (f"compare: {n} attempts of a node", f"/run/{run}/tree/{quote(tree)}/compare?node={quote(parent)}")
        )
    two = _rows(
        base,
        "select run_id, tree_id, leaf_id from top_paths qualify count(*) over (partition by run_id, tree_id) >= 2 "
        "order by run_id, tree_id, rank, leaf_id limit 2",
    )
    if len(two) == 2:
        query = "&".join(f"leaf={quote(r['leaf_id'])}" for r in two)
        pages.append(
            ("compare: two selected paths", f"/run/{two[0]['run_id']}/tree/{quote(two[0]['tree_id'])}/paths?{query}")
        )
    return pages


def _search_pages() -> list[tuple[str, str]]:
    """Searches of every transcript: a common word, a string no message holds (a whole scan), filters."""
    return [
        ("search: a common word", "/search?q=solution"),
        ("search: nothing found (a whole scan)", "/search?q=" + quote("no message holds this 7f3a")),
        ("search: failed tool results of late roots", "/search?q=error&kind=result&stage=late&errors=1"),
        ("search: a tool's calls", "/search?tool=grep&kind=call"),
        ("search: failed calls alone (a count's link)", "/search?errors=1"),
        ("list: pruned attempts (a count's link)", "/search?show=attempts&verdict=pruned"),
        ("list: selected paths of late roots (a coverage cell)", "/search?show=paths&which=selected&stage=late"),
        ("collection: sorted by start, filtered", "/?sort=started&order=desc&q=a"),
    ]


def _render(base: str) -> None:
    """The longest selected path's page in Chromium: the server's time, the page ready, everything drawn."""
    from playwright.sync_api import sync_playwright

    deepest = _rows(base, "select run_id, tree_id, leaf_id, depth from top_paths order by depth desc, run_id limit 1")
    if not deepest:
        return
    run, tree, leaf, depth = (deepest[0][k] for k in ("run_id", "tree_id", "leaf_id", "depth"))
    url = f"{base}/run/{run}/path?tree={quote(tree)}&leaf={quote(leaf)}"
    token = TOKEN["Authorization"].removeprefix("token ")
    timing = (
        "() => { const n = performance.getEntriesByType('navigation')[0]; "
        "return [n.responseStart, n.responseEnd, n.domContentLoadedEventEnd, n.loadEventEnd]; }"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.goto(f"{base}/?token={token}")
        times = []
        for _ in range(4):
            page.goto(url, wait_until="load")
            times.append(page.evaluate(timing))
        messages = page.locator(".msg").count()
        browser.close()
    warm = times[1:]
    server = statistics.median(t[0] for t in warm)
    drawn = statistics.median(t[3] - t[1] for t in warm)
    print(
        f"path of depth {depth} ({2 * int(depth)} turns, {messages} messages) in Chromium: cold "
        f"{times[0][3]:.0f} ms to drawn; warm: the server {server:.0f} ms, then the page drawn in {drawn:.0f} ms "
        "(target 1000 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the collection's data directory")
    parser.add_argument("--repeat", type=int, default=5, help="warm requests of each page")
    parser.add_argument(
        "--browser", action="store_true", help="also time the longest selected path's page in Chromium (Playwright)"
    )
    args = parser.parse_args()
    if not (args.data / "runs").is_dir():
        sys.exit(f"{args.data}: no runs/ there - give a collection's data directory")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    err = Path(tempfile.mkstemp(prefix="web-bench-", suffix=".err")[1])
    with open(err, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "cli.py"), "--data", str(args.data), "serve", "--port", str(port)],
            stdout=fh,
            stderr=fh,
            cwd=ROOT,
        )
    try:
        _wait(base + "/static/app.css", proc, err)
        TOKEN["Authorization"] = "token " + re.search(r"/t/([A-Za-z0-9_-]+)/", err.read_text())[1]
        pages = [("collection", "/")]
        first = "select run_id, tree_id, leaf_id from top_paths order by run_id, tree_id, rank, leaf_id limit 1"
        ms, body = _get(f"{base}/sql", {"q": first, "format": "csv"})
        pages.insert(0, ("(open the collection: first SQL query)", None, ms))
        started = time.perf_counter()  # the collection page's first reading (meanwhile it says it is preparing)
        while b'id="preparing"' in _get(f"{base}/")[1]:
            time.sleep(0.2)
        pages.insert(1, ("(the collection page's first reading)", None, (time.perf_counter() - started) * 1000))
        rows = list(csv.DictReader(io.StringIO(body.decode())))
        if rows:
            run, tree, leaf = rows[0]["run_id"], rows[0]["tree_id"], rows[0]["leaf_id"]
            pages += [
                ("run", f"/run/{run}"),
                ("run (live part)", f"/run/{run}/live"),
                ("tree", f"/run/{run}/tree/{quote(tree)}"),
                ("path", f"/run/{run}/path?tree={quote(tree)}&leaf={quote(leaf)}"),
            ]
        pages += _compare_pages(base) + _search_pages()
        pages += [("sql: count of nodes", ("/sql", {"q": "select count(*) from nodes"})), ("sql: views", "/sql")]
        print(f"{args.data}: page times over the loopback, {args.repeat} warm requests each (ms)")
        print(f"{'page':40} {'cold':>9} {'warm median':>12}  target {TARGET_MS:.0f} ms")
        for entry in pages:
            if entry[1] is None:
                print(f"{entry[0]:40} {entry[2]:9.0f}")
                continue
            name, path = entry
            path, form = path if isinstance(path, tuple) else (path, None)
            cold, _ = _get(base + path, form)
            warm = statistics.median(_get(base + path, form)[0] for _ in range(args.repeat))
            target = SEARCH_TARGET_MS if name.startswith("search") else TARGET_MS
            verdict = ("meets" if warm <= target else "MISSES") + (f" {target:.0f} ms" if target != TARGET_MS else "")
            print(f"{name:40} {cold:9.0f} {warm:12.0f}  {verdict}")
        if args.browser:
            _render(base)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    finally:
        proc.terminate()
        proc.wait(60)
        err.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
