"""Benchmark: replay, audit and export of collections of ~1M, ~5M and ~10M events, beside baselines.

A collection is what a user holds after exploring many tasks: one run per task (a run
explores the roots of one task) of 30 roots (ALGORITHM §1's default; a real
collection is "tens of tasks x 30 roots"), each tree ~3,300 events (turns of dozens
of tool calls), ~100k events a run. 10, 50 and 100 tasks make ~1M, ~5M and ~10M
events: 300, 1,500 and 3,000 trees. Each task's run is a copy of one of three sim
explorations with long turns (seeds 5, 6, 7; ``benchmarks/logs.py``): its parts as
that exploration's writer published and compacted them, under the task's own run id
and task name.

The collections are written once into ``--data`` (default /tmp/collection-data) and
reused: ``base/`` (the explorations), ``1M/``, ``5M/``, ``10M/`` (data directories;
the smaller ones hold hard links to the larger one's parts, and copies of its records) and ``collection.json``
once they are complete.

Each command runs as a user runs it, the CLI command in a process of its own (its peak
RSS is the kernel's ``ru_maxrss`` of that process; its time is the command's, from
parsing the arguments to the last line printed, without starting Python):

- replay: ``python cli.py --data DIR replay --json``, every run of the collection in turn;
- audit: ``python cli.py --data DIR audit --json``, nothing derived before (from the log, as replay);
- export: ``python cli.py --data DIR export --out OUT`` (every run's default selection).

Reads go through the runs' stored derived state (``engine/derived/``), so each read
command is measured cold (``<data>/derived`` deleted first: the first read of a
collection) and warm (a later process, the state stored):

- sql: ``python cli.py --data DIR sql "select count(*) from trees" --json``, and a second
  typical query over the coverage view (``sql-coverage``);
- audit and report (``report --out FILE``) cold, then warm (each warm read after one of its own);
- incremental: one run (a copy of the collection's first) grows by one turn's events
  (~100 tool calls appended by a writer), then one warm ``sql`` query: beside the same
  query with no growth.

Each sql figure is also given end to end (the process's wall time, Python's start
included) beside the *floor process*: a new Python process scanning the light columns
of the same parts with DuckDB.

Beside them, measured on the same files in the same script: the scan floor, DuckDB
scanning the columns the command reads (the light columns for replay and audit; those
and the recorded conversations and contents for export), and the plain-Python replay
(``benchmarks/plain_replay.py``, clearly the baseline) in a process of its own, whose
counts of trees, nodes, edge attempts and decisions must equal the replay's (replay
and audit, which does the replay's work and reads the audit tables too, are compared
with it).
Printed: medians of ``--repeat``, ratios, peak RSS, the load average while measuring,
and the growth exponent from the smallest size to the largest: the slope of log(time)
over log(events). Targets (medians, 2 cores): warm sql <= 1 s end to end at ~10M and
<= 1.2x the floor process at ~1M; warm audit <= 2 s and report <= 5 s at ~10M; cold sql
<= 5x the light-column scan floor; a warm query after one run grew by a turn <= 1.5x
one without growth; replay <= 5x the scan floor and >= 3x faster than the plain-Python
replay at ~1M; peak RSS <= 2 GiB at ~10M for every command.

    python benchmarks/collection.py [--data DIR] [--sizes 1M 5M 10M] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.compute as pc  # noqa: E402

from benchmarks.logs import SNAPSHOTS, copy_run, light_columns, long_turns, scan_floor  # noqa: E402
from ingest.log import EventLog, run_ids  # noqa: E402

SIZES = {"1M": 10, "5M": 50, "10M": 100}  # tasks (runs of 30 trees) per collection
SEEDS = (5, 6, 7)
MARKER = "collection.json"
MADE_BY = "benchmarks/collection.py v2"  # v2: part names carry checksums
COMMANDS = ("replay", "audit", "export")
SQL = {
    "sql": "select count(*) as trees from trees",
    "sql-coverage": "select stratum_key as stage, sum(selected_paths) as paths, sum(n_eff) as n_eff "
    "from coverage where stratum = 'stage' group by all order by all",
}
READS = ("sql", "sql-coverage", "audit", "report")  # measured warm
CLI_ARGS = {
    "sql": lambda out: ["sql", SQL["sql"], "--json"],
    "sql-coverage": lambda out: ["sql", SQL["sql-coverage"], "--json"],
    "audit": lambda out: ["audit", "--json"],
    "report": lambda out: ["report", "--out", str(out) + ".html"],
}
COLD = ("sql", "audit")  # measured cold too: nothing derived (now; at every decision)
EXPORT_COLUMNS = ["messages", "body"]  # what export reads beside the light columns


# ------------------------------------------------------------ the collections


def ensure_collections(root: Path, sizes: list[str]) -> dict[str, int]:
    """Write the collections of ``sizes`` under ``root`` unless they are there; their event counts."""
    marker = root / MARKER
    held = json.loads(marker.read_text()) if marker.exists() else None
    if held and held.get("made_by") == MADE_BY and set(sizes) <= set(held["events"]):
        return {s: held["events"][s] for s in sizes}
    if root.exists() and any(root.iterdir()) and held is None:
        sys.exit(f"{root}: not empty and not written by this benchmark - give another --data")
    wanted = sorted(
        set(sizes) | set(held["events"] if held and held.get("made_by") == MADE_BY else []), key=SIZES.__getitem__
    )
    for name in ("base", *SIZES, MARKER):
        path = root / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    from engine.exploration import new_run

    base = root / "base"
    for seed in SEEDS:
        print(f"writing the sim exploration with seed {seed} ...", flush=True)
        new_run(base, SNAPSHOTS, long_turns(seed), f"base-{seed}", select=True)
    largest = wanted[-1]
    for k in range(1, SIZES[largest] + 1):
        copy_run(base, f"base-{SEEDS[k % len(SEEDS)]}", root / largest, f"task-{k:03d}", f"task-{k:03d}")
    for size in wanted[:-1]:  # the smaller collections: the first runs of the largest, hard-linked
        for run in run_ids(root / largest)[: SIZES[size]]:
            log_dir = root / size / "runs" / run / "log"
            log_dir.mkdir(parents=True)
            for part in EventLog(root / largest, run).parts():
                os.link(part.path, log_dir / part.path.name)
            shutil.copyfile(root / largest / "runs" / run / "log" / "_record.jsonl", log_dir / "_record.jsonl")
    events = {s: sum(EventLog(root / s, r).tail_seq() for r in run_ids(root / s)) for s in wanted}
    marker.write_text(json.dumps({"made_by": MADE_BY, "events": events}, indent=2) + "\n")
    return {s: events[s] for s in sizes}


def part_files(data: Path) -> list[str]:
    return [str(p.path) for run in run_ids(data) for p in EventLog(data, run).parts()]


# ------------------------------------------------------------ one measurement, in a process of its own


def child(command: str, data: Path, out: Path) -> None:
    """Run one command (or the baseline) here and print what it took and what it found as JSON."""
    if command == "baseline":
        import plain_replay

        start = time.perf_counter()
        results = [plain_replay.replay(data, run) for run in run_ids(data)]
        seconds = time.perf_counter() - start
        found = {
            "trees": sum(r.trees for r in results),
            "nodes": sum(r.nodes for r in results),
            "edges": sum(r.edges for r in results),
            "decisions": sum(r.decisions for r in results),
            "differ": sum(len(r.differences) for r in results),
        }
        print(json.dumps({"seconds": seconds, **found}))
        return
    from cli import cli

    args = {
        "replay": ["replay", "--json"],
        "audit": ["audit", "--json"],
        "export": ["export", "--out", str(out), "--overwrite", "--json"],
        "report": ["report", "--out", str(out) + ".html"],
        **{name: ["sql", query, "--json"] for name, query in SQL.items()},
    }[command]
    printed = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        try:
            cli.main(["--data", str(data), *args], standalone_mode=False)
        except SystemExit as stop:
            if stop.code:
                raise
    seconds = time.perf_counter() - start
    found = {} if command == "report" else summary(command, json.loads(printed.getvalue()))
    print(json.dumps({"seconds": seconds, **found}))


def summary(command: str, output: dict) -> dict:
    """What the benchmark checks of a command's JSON output."""
    if command == "replay":
        trees = [t for run in output["runs"] for t in run["trees"]]
        return {
            "trees": len(trees),
            "nodes": sum(t["nodes"] for t in trees),
            "decisions": output["decisions"],
            "edges": sum(
                t["kept_edges"] + t["pruned_edges"] + t["retried_edges"] + t["in_flight_edges"] for t in trees
            ),
            "differ": output["differ"],
        }
    if command == "audit":
        return {"runs": len(output["runs"]), "violations": len(output["violations"])}
    if command in SQL:
        return {"rows": len(output)}
    return {"samples": output["samples"]}


# The floor process: what a new Python process needs to scan the light columns of a
# collection's parts, DuckDB alone (argv: the data directory, the columns as JSON).
FLOOR = """
import glob, json, sys, time
import duckdb
start = time.perf_counter()
files = sorted(glob.glob(sys.argv[1] + "/runs/*/log/part-*.parquet"))
columns = json.loads(sys.argv[2])
sql = "select " + ", ".join(f'max("{c}")' for c in columns) + " from read_parquet(?, union_by_name=true)"
con = duckdb.connect()
con.execute("set enable_progress_bar = false")  # (over ~2 s DuckDB draws one on stdout)
con.execute(sql, [files]).fetchall()
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def measure(command: str, data: Path, out: Path, as_user: bool = False) -> dict:
    """One child process: the command's time and findings, and the child's peak RSS (bytes).

    ``wall``: the process's time end to end, Python's start included. ``as_user``: a read
    command (READS) run as a user runs it, ``python cli.py ...`` (``seconds`` is then the
    wall time too); the floor runs FLOOR; the rest run in this script's child mode, which
    times the command from parsing its arguments on.
    """
    if command == "floor":
        argv = [sys.executable, "-c", FLOOR, str(data), Path(str(out) + ".columns").read_text()]
    elif as_user:
        argv = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), *CLI_ARGS[command](out)]
    else:
        argv = [sys.executable, __file__, "--child", command, "--data", str(data), "--out", str(out)]
    with (
        open(out.with_name(out.name + ".stdout"), "w+b") as stdout,
        open(out.with_name(out.name + ".stderr"), "w+b") as stderr,
    ):
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            cwd=ROOT,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        stdout.seek(0)
        stderr.seek(0)
        printed, problems = stdout.read().decode(), stderr.read().decode()
    Path(stdout.name).unlink()
    Path(stderr.name).unlink()
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{command} on {data} failed:\n{problems[-3000:]}")
    found = {"seconds": wall} if as_user else json.loads(printed.strip().splitlines()[-1])
    return {**found, "rss": usage.ru_maxrss * 1024, "wall": wall}


# ------------------------------------------------------------ the report


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/collection-data"))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-repeat", type=int, default=1, help="plain-Python replays per size")
    parser.add_argument(
        "--reads-only", action="store_true", help="only the reads of derived state (cold, warm, after growth)"
    )
    parser.add_argument("--child", choices=[*COMMANDS, "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        child(args.child, args.data, args.out)
        return
    sizes = sorted(set(args.sizes), key=SIZES.__getitem__)
    events = ensure_collections(args.data.resolve(), sizes)
    print(
        f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
        f"collections in {args.data}"
    )
    table: dict[str, dict[str, dict]] = {}
    for size in sizes:
        data = args.data.resolve() / size
        out = args.data.resolve() / f"export-{size}"
        files = part_files(data)
        light = light_columns(files)
        if args.reads_only:
            light_floor = statistics.median(scan_floor(files, light) for _ in range(args.repeat))
            print(
                f"\n{size}: {len(run_ids(data))} runs, {events[size]:,} events; load average "
                f"{os.getloadavg()[0]:.1f} at the start; scan floor of the light columns {light_floor:.3f} s"
            )
            reads = measure_reads(data, out, args.repeat)
            grown = [measure_growth(args.data.resolve(), size, args.repeat, n) for n in (1, 5)]
            report_reads(size, reads, grown, light_floor, None)
            print(f"  load average {os.getloadavg()[0]:.1f} at the end")
            continue
        loads = [os.getloadavg()[0]]
        floors = {"light": [], "export": []}
        runs: dict[str, list[dict]] = {c: [] for c in (*COMMANDS, "baseline")}
        for i in range(max(args.repeat, args.baseline_repeat)):
            floors["light"].append(scan_floor(files, light))
            floors["export"].append(scan_floor(files, light + EXPORT_COLUMNS))
            for command in COMMANDS if i < args.repeat else ():
                if command == "audit":  # from the log, as replay and the baseline are: no state stored before
                    shutil.rmtree(data / "derived", ignore_errors=True)
                runs[command].append(measure(command, data, out))
                loads.append(os.getloadavg()[0])
            if i < args.baseline_repeat:
                runs["baseline"].append(measure("baseline", data, out))
                loads.append(os.getloadavg()[0])
        shutil.rmtree(out, ignore_errors=True)
        check_agreement(size, runs)
        floor = {k: statistics.median(v) for k, v in floors.items()}
        row = table[size] = {"events": events[size], "floor": floor, "load": (min(loads), max(loads))}
        for command, results in runs.items():
            row[command] = {"seconds": median_of(results, "seconds"), "rss": max(r["rss"] for r in results)}
        report_size(size, row, len(run_ids(data)), args.repeat, args.baseline_repeat)
        reads = measure_reads(data, out, args.repeat)
        grown = [measure_growth(args.data.resolve(), size, args.repeat, n) for n in (1, 5)]
        report_reads(size, reads, grown, floor["light"], row["baseline"]["seconds"])
        row["reads"], row["grown"] = reads, grown
    if not args.reads_only:
        report_growth(table, sizes)


def measure_reads(data: Path, out: Path, repeat: int) -> dict[str, dict]:
    """The COLD commands once with nothing derived (``<data>/derived`` deleted first), every read
    command warm ``repeat`` times after a read of its own that is not measured (what it reads is stored
    then, whatever the reads before stored: a cold audit leaves the states of another flavour than
    sql's), and the floor process (a new Python process scanning the light columns) ``repeat`` times."""
    found: dict[str, dict] = {}
    for command in COLD:
        shutil.rmtree(data / "derived", ignore_errors=True)
        found[command] = {"cold": measure(command, data, out, as_user=True)}
    for command in READS:
        measure(command, data, out, as_user=True)
        warm = [measure(command, data, out, as_user=True) for _ in range(repeat)]
        found.setdefault(command, {})["warm"] = {k: median_of(warm, k) for k in ("seconds", "wall")}
        found[command]["rss"] = max(
            r["rss"] for r in [*warm, *([found[command]["cold"]] if "cold" in found[command] else [])]
        )
    Path(str(out) + ".columns").write_text(json.dumps(light_columns(part_files(data))))
    floors = [measure("floor", data, out) for _ in range(repeat)]
    Path(str(out) + ".columns").unlink()
    found["floor"] = {k: median_of(floors, k) for k in ("seconds", "wall")}
    Path(str(out) + ".html").unlink(missing_ok=True)
    return found


def measure_growth(root: Path, size: str, repeat: int, count: int = 1) -> dict[str, float]:
    """A warm sql query, then the same after ``count`` runs grew by one turn's events each, ``repeat`` times.

    The collection's runs are hard-linked into ``grow-<size>/`` but the first ``count``, copied
    (their records and parts are appended to); each growth appends ~100 of a run's own tool
    calls again, as a turn's recorder would (the trees' views change; no decision is taken):
    another writer's (a resume that ended, a writer killed), which no live writer's mark covers.
    """
    from ingest.log import LogWriter
    from ingest.schema import from_row

    data, src = root / f"grow-{size}", root / size
    shutil.rmtree(data, ignore_errors=True)
    runs = run_ids(src)
    for i, run in enumerate(runs):
        (data / "runs").mkdir(parents=True, exist_ok=True)
        if i < count:
            shutil.copytree(src / "runs" / run, data / "runs" / run)
        else:
            shutil.copytree(src / "runs" / run, data / "runs" / run, copy_function=os.link)
    turns = {}
    for grown in runs[:count]:
        calls = EventLog(data, grown).read_table()
        calls = calls.filter(pc.equal(calls.column("kind"), "tool_called")).slice(0, 100).to_pylist()
        turns[grown] = [from_row({k: v for k, v in row.items() if k not in ("seq", "recorded_at")}) for row in calls]
    out = root / f"grow-{size}.out"
    measure("sql", data, out, as_user=True)  # the states, derived
    plain, after = [], []
    for _ in range(repeat):
        plain.append(measure("sql", data, out, as_user=True)["wall"])
        for grown, turn in turns.items():
            with LogWriter.open(data, grown) as writer:
                writer.append(turn)
        after.append(measure("sql", data, out, as_user=True)["wall"])
    shutil.rmtree(data, ignore_errors=True)
    return {"plain": statistics.median(plain), "grown": statistics.median(after), "events": 100, "runs": count}


def report_reads(size: str, reads: dict, grown: list[dict], light_floor: float, baseline: float | None) -> None:
    floor = reads["floor"]
    print(
        f"  floor process (a new Python scanning the light columns): {floor['wall']:.2f} s end to end, "
        f"{floor['seconds']:.2f} s its scan"
    )
    for command in READS:
        r = reads[command]
        warm = r["warm"]
        cold = (
            f"cold {r['cold']['seconds']:6.2f} s = {r['cold']['seconds'] / light_floor:5.1f}x the scan floor; "
            if "cold" in r
            else ""
        )
        print(
            f"  {command:12s} {cold}warm {warm['seconds']:5.2f} s, {warm['wall']:5.2f} s end to end = "
            f"{warm['wall'] / floor['wall']:4.2f}x the floor process; peak RSS {mb(r['rss'])}"
        )
    for g in grown:
        print(
            f"  after {g['runs']} run(s) grew by {g['events']} events each (another writer): sql {g['grown']:.2f} s "
            f"end to end vs {g['plain']:.2f} s without growth = {g['grown'] / g['plain']:.2f}x"
        )


def check_agreement(size: str, runs: dict[str, list[dict]]) -> None:
    """Replay and the baseline found no difference and counted the same trees, nodes, edges, decisions."""
    replay, baseline = runs["replay"][0], runs["baseline"][0]
    counted = ("trees", "nodes", "edges", "decisions")
    if replay["differ"] or baseline["differ"] or any(replay[k] != baseline[k] for k in counted):
        sys.exit(f"{size}: replay and the plain-Python baseline disagree: {replay} vs {baseline}")
    if any(r["violations"] for r in runs["audit"]):
        sys.exit(f"{size}: the audit lists violations")


def report_size(size: str, row: dict, n_runs: int, repeat: int, baseline_repeat: int) -> None:
    floor, base = row["floor"], row["baseline"]["seconds"]
    print(
        f"\n{size}: {n_runs} runs, {n_runs * 30} trees, {row['events']:,} events; load average "
        f"{row['load'][0]:.1f}-{row['load'][1]:.1f}; medians of {repeat} (baseline: {baseline_repeat})"
    )
    print(
        f"  scan floor: light columns {floor['light']:.3f} s, with conversations and contents {floor['export']:.3f} s"
    )
    for command in COMMANDS:
        r = row[command]
        against = floor["export" if command == "export" else "light"]
        versus = f"; {base / r['seconds']:.1f}x faster than plain Python" if command != "export" else ""
        print(
            f"  {command:7s} {r['seconds']:7.2f} s = {r['seconds'] / against:5.1f}x the scan floor{versus}; "
            f"peak RSS {mb(r['rss'])}"
        )
    print(f"  plain-Python replay {base:.2f} s; peak RSS {mb(row['baseline']['rss'])}")


def report_growth(table: dict[str, dict], sizes: list[str]) -> None:
    if len(sizes) < 2:
        return
    low, high = table[sizes[0]], table[sizes[-1]]
    span = math.log(high["events"] / low["events"])
    parts = [f"{c} {math.log(high[c]['seconds'] / low[c]['seconds']) / span:.2f}" for c in (*COMMANDS, "baseline")]
    print(f"\ngrowth exponent {sizes[0]} -> {sizes[-1]} (slope of log time over log events): " + ", ".join(parts))


if __name__ == "__main__":
    main()
