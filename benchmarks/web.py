"""Benchmark: the server time of each page of ``serve`` over a collection, against the 300 ms target.

``python cli.py --data DIR serve`` runs as a user runs it, in a process of its own on a
free port; each page is requested once cold (the first request of the server opens the
collection, the path page builds its sample as ``export`` does) and then ``--repeat``
times warm, from this process over the loopback (the HTTP round trip on the loopback
is well under a millisecond, so a request's time is the server's). The run, tree and
path asked for are the first selected path of the collection (read through the SQL
page). Requests carry the token the server printed; SQL is POSTed as its page's form
does. Printed: each page's cold time, its warm median and the target (warm medians
<= 300 ms on the ~10M-event collection, issue 27), and the load average.

    python benchmarks/web.py --data /tmp/collection-data/1M [--repeat 5]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the collection's data directory")
    parser.add_argument("--repeat", type=int, default=5, help="warm requests of each page")
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
        TOKEN["Authorization"] = "token " + re.search(r"\?token=(\S+)", err.read_text())[1]
        pages = [("collection", "/")]
        first = "select run_id, tree_id, leaf_id from top_paths order by run_id, tree_id, rank, leaf_id limit 1"
        ms, body = _get(f"{base}/sql", {"q": first, "format": "csv"})
        pages.insert(0, ("(open the collection: first SQL query)", None, ms))
        rows = list(csv.DictReader(io.StringIO(body.decode())))
        if rows:
            run, tree, leaf = rows[0]["run_id"], rows[0]["tree_id"], rows[0]["leaf_id"]
            pages += [
                ("run", f"/run/{run}"),
                ("run (live part)", f"/run/{run}/live"),
                ("tree", f"/run/{run}/tree/{quote(tree)}"),
                ("path", f"/run/{run}/path?tree={quote(tree)}&leaf={quote(leaf)}"),
            ]
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
            verdict = "meets" if warm <= TARGET_MS else "MISSES"
            print(f"{name:40} {cold:9.0f} {warm:12.0f}  {verdict}")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    finally:
        proc.terminate()
        proc.wait(60)
        err.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
