"""Benchmark: replay time against the DuckDB scan floor of the same Parquet columns.

Two runs: the README pipeline on the bundled Student run (30 trees, sim Teacher),
and a ~300-tree, ~1M-event run made by tiling a 30-tree sim run with long turns ten
times (tree ids renamed, seqs and watermarks shifted, so every decision stays valid)
and ending it as an exploration ends: the Top-k selection over all its trees, then
RunFinished.
For each: the median replay time (load the log, rebuild every tree, re-derive every
decision) and the median time DuckDB takes to scan the same columns of the same
Parquet files. Target: replay <= 5x the floor. Loading the events includes checking
every part against the checksum its name records (every byte read once); that
check alone is timed too.

    python benchmarks/replay.py [--repeat 3] [--copies 10]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.catalog import Catalog  # noqa: E402
from engine.config import RunConfig, TreeConfig  # noqa: E402
from engine.exploration import new_run  # noqa: E402
from engine.replay import PHASES, replay_run  # noqa: E402
from engine.selections import default_parameters, selection_decision  # noqa: E402
from ingest.events import LIGHT_SCHEMA, RunFinished  # noqa: E402
from ingest.log import EventLog, LogWriter, check_part, encode_part, part_name, run_dir  # noqa: E402

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
ONCE = {"run_started", "snapshot_seen", "snapshots_picked", "paths_selected", "content_recorded"}
ID_COLUMNS = ("tree_id", "edge_id", "parent_id", "child_id", "node_id")


def floor_seconds(data: Path, run_id: str) -> float:
    """DuckDB scanning every light column of the run's parts (max of each column)."""
    files = [str(p.path) for p in EventLog(data, run_id).parts()]
    present = set()
    for f in files:
        present |= set(pq.read_schema(f).names)
    cols = [c for c in LIGHT_SCHEMA.names if c in present]
    sql = "select " + ", ".join(f'max("{c}")' for c in cols) + " from read_parquet(?, union_by_name=true)"
    con = duckdb.connect()
    start = time.perf_counter()
    con.execute(sql, [files]).fetchall()
    return time.perf_counter() - start


def checksum_seconds(data: Path, run_id: str) -> tuple[float, int]:
    """Wall time of checking every part of the run as a reader does, and the bytes read."""
    parts = EventLog(data, run_id).parts()
    start = time.perf_counter()
    for part in parts:
        check_part(part)
    return time.perf_counter() - start, sum(p.path.stat().st_size for p in parts)


def replay_seconds(data: Path, run_id: str) -> tuple[float, dict[str, float], int]:
    """Wall time of one replay, its phases, and the decisions it re-derived."""
    start = time.perf_counter()
    result = replay_run(data, run_id)
    elapsed = time.perf_counter() - start
    assert not result.differences, result.differences[:3]
    return elapsed, result.seconds, result.decisions


def tile(data: Path, src: str, dst: str, copies: int, select_at_end: bool = True) -> None:
    """Write run ``dst``: ``copies`` back-to-back copies of ``src`` with renamed trees.

    Whole-run events (config, snapshot selection, recorded contents) are kept once; each copy's seqs and
    watermarks are shifted together, so every decision still sees the same tree
    state. As at the end of an exploration, the default path selection over every
    tree and RunFinished follow the copies. With ``select_at_end=False`` the first
    copy's path selection is kept instead, which later tree facts follow.
    """
    drop = {"run_finished"} | ({"paths_selected"} if select_at_end else set())
    source = EventLog(data, src).read_table()
    rows = source.to_pylist()
    trees = sorted({r["tree_id"] for r in rows if r["tree_id"]})
    out: list[dict] = []
    for k in range(copies):
        rename = {t: f"T{k * len(trees) + i + 1:04d}" for i, t in enumerate(trees)}
        new_seq: dict[int, int] = {}
        start = len(out)
        for r in rows:
            if r["kind"] not in drop and (k == 0 or r["kind"] not in ONCE):
                r2 = dict(r)
                for col in ID_COLUMNS:
                    if r2[col]:
                        tree = r2[col].split("/")[0].split(".")[0]
                        r2[col] = rename[tree] + r2[col][len(tree):]
                if r2["paths"]:  # the ids inside a recorded path selection
                    r2["paths"] = re.sub(r'"(T\d+)(?=[".])',
                                         lambda m, names=rename: '"' + names[m.group(1)], r2["paths"])
                r2["seq"] = len(out) + 1
                out.append(r2)
            new_seq[r["seq"]] = len(out)  # a dropped event maps to the last kept one
        for r2 in out[start:]:
            if r2["watermark"] is not None:
                r2["watermark"] = new_seq[r2["watermark"]]
    table = pa.Table.from_pylist(out, schema=source.schema)
    log_dir = run_dir(data, dst) / "log"
    log_dir.mkdir(parents=True)
    step = 100_000
    for first in range(0, table.num_rows, step):
        part = table.slice(first, step)
        encoded, digest = encode_part(part, level=3)
        (log_dir / part_name(first + 1, first + part.num_rows, 3, digest)).write_bytes(encoded.to_pybytes())
    with LogWriter.open(data, dst) as writer:  # opening checks the parts form a gapless log
        catalog = Catalog.for_log(EventLog(data, dst))
        weights, top_k = default_parameters(catalog)
        end = [selection_decision(catalog, writer.tail, weights, top_k)] if select_at_end else []
        writer.append([*end, RunFinished()])


def write_runs(data: Path, copies: int) -> None:
    """Write the two runs measured: ``bundled`` (the README pipeline) and ``big`` (tiled).

    ``big`` tiles a 30-tree run with long turns (11-19 tool calls per step): ten copies
    make 300 trees and ~1M events.
    """
    new_run(data, SNAPSHOTS, RunConfig(task="kernel-speedup", parallel=16), "bundled", select=True)
    long_turns = RunConfig(task="kernel-speedup", parallel=16, seed=5,
                           backend_options={"calls_per_step": [11, 19]}, tree=TreeConfig())  # fmt: skip
    new_run(data, SNAPSHOTS, long_turns, "base", select=True)
    tile(data, "base", "big", copies)


def measure(label: str, data: Path, run_id: str, repeat: int) -> None:
    floors = [floor_seconds(data, run_id) for _ in range(repeat)]
    replays = [replay_seconds(data, run_id) for _ in range(repeat)]
    floor = statistics.median(floors)
    replay = statistics.median(r[0] for r in replays)
    events, decisions = EventLog(data, run_id).tail_seq(), replays[0][2]
    print(f"{label}: {events} events, {decisions} decisions: replay {replay:.2f} s, "
          f"scan floor {floor:.3f} s, ratio {replay / floor:.1f}x (target <= 5x)")
    phases = {name: statistics.median(r[1][name] for r in replays) for name in PHASES}
    print("  phases (median, x floor): " + ", ".join(f"{n} {s:.2f} s ({s / floor:.1f}x)" for n, s in phases.items()))
    checks = [checksum_seconds(data, run_id) for _ in range(repeat)]
    check, size = statistics.median(c[0] for c in checks), checks[0][1]
    print(f"  of which the parts' checksums (median): {check:.3f} s for {size / 1e6:.1f} MB "
          f"({check / replay:.0%} of the replay, {check / floor:.1f}x the floor)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--copies", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_runs(data, args.copies)
        measure("bundled run (30 trees)", data, "bundled", args.repeat)
        measure(f"tiled run ({30 * args.copies} trees)", data, "big", args.repeat)


if __name__ == "__main__":
    main()
