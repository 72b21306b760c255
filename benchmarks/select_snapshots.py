"""Benchmark: ``select-snapshots`` on a generated 10,000-snapshot corpus.

Prints the wall time of the whole command (median of --repeat runs) next to two
baselines measured in the same script: listing every metadata.json and attempt
file (the I/O floor) and the scan into facts alone. Target: <= 15 s on 2 cores.

    python benchmarks/select_snapshots.py [--snapshots 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "data"))

from make_student_run import generate  # noqa: E402

from ingest.snapshots import scan  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshots", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--attempts-window", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "all_snapshots"
        t = timed(
            lambda: generate(corpus, args.snapshots, agents=8, seed=1, pending=20, attempts_window=args.attempts_window)
        )
        print(f"generated {args.snapshots} snapshots in {t:.1f} s")

        def io_floor() -> None:
            for folder in corpus.iterdir():
                (folder / "metadata.json").read_bytes()
                for f in (folder / "shared" / "attempts").iterdir():
                    f.stat()

        io_floor()  # warm the page cache so every measurement below reads from memory
        floor = statistics.median(timed(io_floor) for _ in range(args.repeat))
        scan_only = statistics.median(timed(lambda: scan(corpus, "bench")) for _ in range(args.repeat))
        runs = []
        for i in range(args.repeat):
            out = Path(tmp) / f"roots{i}"
            cmd = [
                sys.executable,
                str(ROOT / "cli.py"),
                "--data",
                str(Path(tmp) / "data"),
                "select-snapshots",
                str(corpus),
                str(out),
                "--task",
                "bench",
            ]
            runs.append(timed(lambda cmd=cmd: subprocess.run(cmd, check=True, capture_output=True)))
        total = statistics.median(runs)
        print(f"io floor (read metadata, stat attempts): {floor:6.2f} s")
        print(f"scan into facts:                         {scan_only:6.2f} s  ({scan_only / floor:.1f}x floor)")
        print(
            f"select-snapshots command (median of {args.repeat}): {total:6.2f} s  "
            f"({total / floor:.1f}x floor; target <= 15 s)"
        )


if __name__ == "__main__":
    main()
