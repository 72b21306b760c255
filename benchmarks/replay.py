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
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.logs import SNAPSHOTS, floor_seconds, long_turns, tile  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from engine.exploration import new_run  # noqa: E402
from engine.replay import PHASES, replay_run  # noqa: E402
from ingest.log import EventLog, check_part  # noqa: E402

__all__ = ["floor_seconds", "main", "tile", "write_runs"]  # benchmarks/audit.py and compare.py import them from here


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


def write_runs(data: Path, copies: int) -> None:
    """Write the two runs measured: ``bundled`` (the README pipeline) and ``big`` (tiled).

    ``big`` tiles a 30-tree run with long turns (11-19 tool calls per step): ten copies
    make 300 trees and ~1M events.
    """
    new_run(data, SNAPSHOTS, RunConfig(task="kernel-speedup", parallel=16), "bundled", select=True)
    new_run(data, SNAPSHOTS, long_turns(), "base", select=True)
    tile(data, "base", "big", copies)


def measure(label: str, data: Path, run_id: str, repeat: int) -> None:
    floors = [floor_seconds(data, run_id) for _ in range(repeat)]
    replays = [replay_seconds(data, run_id) for _ in range(repeat)]
    floor = statistics.median(floors)
    replay = statistics.median(r[0] for r in replays)
    events, decisions = EventLog(data, run_id).tail_seq(), replays[0][2]
    print(
        f"{label}: {events} events, {decisions} decisions: replay {replay:.2f} s, "
        f"scan floor {floor:.3f} s, ratio {replay / floor:.1f}x (target <= 5x)"
    )
    phases = {name: statistics.median(r[1][name] for r in replays) for name in PHASES}
    print("  phases (median, x floor): " + ", ".join(f"{n} {s:.2f} s ({s / floor:.1f}x)" for n, s in phases.items()))
    checks = [checksum_seconds(data, run_id) for _ in range(repeat)]
    check, size = statistics.median(c[0] for c in checks), checks[0][1]
    print(
        f"  of which the parts' checksums (median): {check:.3f} s for {size / 1e6:.1f} MB "
        f"({check / replay:.0%} of the replay, {check / floor:.1f}x the floor)"
    )


def main(measure: Callable[[str, Path, str, int], None] = measure, doc: str = __doc__) -> None:
    """Measure the bundled run and a tiled one (``--copies`` × 30 trees); audit.py measures its own way."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
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
