"""Benchmark: reading a collection while its runs are written (the users' main case), beside a still one.

The ~1M-event collection of ``benchmarks/collection.py`` (10 runs of ~100k events),
its runs copied (hard links) under ``live/``; N of them (``--growing``, default 5 and
20: the others are copies of the first runs under new ids) grow while a reader reads:

- each growing run has a writer process of its own, as an exploration has: it holds the
  run's catalog (``Catalog.for_log``, one thread, as the engine) and every ``--period``
  seconds (default 1) stages a turn's events (100 of the run's own tool calls again),
  publishes them and tells the run's keeper (``engine/derived/live.py``), exactly as
  ``Explorer._publish`` does;
- a reader runs ``python cli.py --data DIR sql "select count(*) from trees" --json`` in a
  loop, a process each, as a user types it, for ``--seconds`` (default 30).

Printed for each N: the reader's median and 90th percentile wall time, beside the same
query on the still collection (the same runs, nothing growing, states stored), and the
same live case with the writers not keeping their states (``--no-keep``'s case: every
read catches up each run that grew, as before the writer kept them), each as a ratio to
the still read. Target (2 cores): a read during the live case <= 1.5x the still read.

    python benchmarks/live.py [--data DIR] [--growing 5 20] [--seconds 30] [--period 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.collection import ensure_collections  # noqa: E402
from ingest.log import EventLog, run_ids  # noqa: E402

QUERY = "select count(*) as trees from trees"


def writer(data: Path, run_id: str, period: float, keep: bool, stop: Path) -> None:
    """Grow one run by a turn's events every ``period`` seconds until ``stop`` exists, as the engine does."""
    import pyarrow.compute as pc

    from engine.catalog import DECISION_THREADS, Catalog
    from engine.derived.live import Keeper
    from ingest.log import LogWriter
    from ingest.schema import from_row

    log = EventLog(data, run_id)
    calls = log.read_table()
    calls = calls.filter(pc.equal(calls.column("kind"), "tool_called")).slice(0, 100).to_pylist()
    turn = [from_row({k: v for k, v in row.items() if k not in ("seq", "recorded_at")}) for row in calls]
    keeper = Keeper(data, run_id)
    with LogWriter.open(data, run_id) as out:
        catalog = Catalog.for_log(log, threads=DECISION_THREADS)
        catalog.refresh()
        print("ready", flush=True)
        due = time.monotonic()
        while not stop.exists():
            due += period
            catalog.insert(out.stage(turn))
            out.flush()
            if keep:
                keeper.published(catalog)
            time.sleep(max(0.0, due - time.monotonic()))
    keeper.close()


def read_once(data: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "sql", QUERY, "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    return time.perf_counter() - started


def reads(data: Path, seconds: float) -> list[float]:
    found = []
    until = time.monotonic() + seconds
    while time.monotonic() < until or len(found) < 5:
        found.append(read_once(data))
    return found


def make_live(root: Path, n_runs: int) -> Path:
    """``live/``: the 1M collection's runs (their parts hard-linked, their records copied) and, to make
    ``n_runs``, more tasks' runs written as that collection's are (``benchmarks/logs.py``'s copy_run)."""
    from benchmarks.collection import SEEDS
    from benchmarks.logs import copy_run

    src = root / "1M"
    data = root / "live"
    shutil.rmtree(data, ignore_errors=True)
    runs = run_ids(src)
    for run in runs:
        log_dir = data / "runs" / run / "log"
        log_dir.mkdir(parents=True)
        for part in EventLog(src, run).parts():
            os.link(part.path, log_dir / part.path.name)
        shutil.copyfile(src / "runs" / run / "log" / "_record.jsonl", log_dir / "_record.jsonl")
    for k in range(len(runs) + 1, n_runs + 1):
        copy_run(root / "base", f"base-{SEEDS[k % len(SEEDS)]}", data, f"task-{k:03d}", f"task-{k:03d}")
    return data


def live_case(data: Path, growing: list[str], seconds: float, period: float, keep: bool) -> list[float]:
    """The reader's times while ``growing`` runs are written (each by a writer process)."""
    stop = data / "stop"
    stop.unlink(missing_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--writer", run, "--data", str(data), "--period", str(period)]
            + ([] if keep else ["--no-keep"]),
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for run in growing
    ]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                sys.exit("a writer failed to start")
        return reads(data, seconds)
    finally:
        stop.touch()
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        stop.unlink(missing_ok=True)


def figures(times: list[float]) -> str:
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) >= 2 else times[0]
    return f"median {statistics.median(times):6.3f} s  p90 {p90:6.3f} s  ({len(times)} reads)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/collection-data"))
    parser.add_argument("--growing", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    parser.add_argument("--no-keep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        writer(args.data, args.writer, args.period, not args.no_keep, args.data / "stop")
        return
    ensure_collections(args.data, ["1M"])
    print(f"live reads: {QUERY!r}, each run growing by 100 tool calls every {args.period:g} s, {os.cpu_count()} cores")
    for n in args.growing:
        data = make_live(args.data, n)
        runs = run_ids(data)
        read_once(data)  # every run's state stored
        still = reads(data, args.seconds)
        keeping = live_case(data, runs[:n], args.seconds, args.period, keep=True)
        catching = live_case(data, runs[:n], args.seconds, args.period, keep=False)
        base = statistics.median(still)
        print(f"\n{len(runs)} runs, {n} growing (load {os.getloadavg()[0]:.1f}):")
        print(f"  still collection                {figures(still)}")
        print(
            f"  live, writers keep the state    {figures(keeping)}  "
            f"{statistics.median(keeping) / base:5.2f}x still (target <= 1.5x)"
        )
        print(
            f"  live, readers catch up          {figures(catching)}  {statistics.median(catching) / base:5.2f}x still"
        )
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
