"""Benchmark: ``export`` of a ~1M-event run: wall time and the exporting process's peak RSS.

The run is the replay benchmark's tiled one (a 30-tree sim run with long turns,
tiled ten times: 300 trees), ending with the default path and supervision selections
over every tree. Every format is timed: the SFT samples (chat, atif) and the
preference pairs, labelled attempts and step-labelled paths (dpo, kto, steps), each
beside the chat export's time.
``export`` runs as a user runs it, ``python cli.py export``, in a process of its
own, once per format; its peak RSS (from the kernel's accounting of the child) is
printed beside the size of the log and of the turns' transcripts, which an export
must not hold.

    python benchmarks/export.py [--copies 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.logs import SNAPSHOTS, long_turns, tile  # noqa: E402
from engine.exploration import new_run  # noqa: E402
from ingest.log import EventLog  # noqa: E402


def timed_export(data: Path, run_id: str, out: Path, fmt: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one ``python cli.py export`` process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "export",
            run_id,
            "--out",
            str(out),
            "--format",
            fmt,
            "--overwrite",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"export failed: {err}")
    return elapsed, usage.ru_maxrss * 1024


def make_run(data: Path, copies: int) -> None:
    """Write the tiled run and print its size (run in a process of its own, see main)."""
    new_run(data, SNAPSHOTS, long_turns(), "base", select=True)
    tile(data, "base", "big", copies)
    log = EventLog(data, "big")
    heavy = log.read_table(["transcript", "messages"])
    transcripts = pc.sum(pc.binary_length(heavy.column("transcript"))).as_py() or 0
    conversations = pc.sum(pc.binary_length(heavy.column("messages"))).as_py() or 0
    disk = sum(p.path.stat().st_size for p in log.parts())
    print(
        f"tiled run ({30 * copies} trees): {log.tail_seq()} events, log {disk / 1e6:.0f} MB on disk; "
        f"transcripts {transcripts / 1e6:.0f} MB, recorded conversations {conversations / 1e6:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--make", type=Path, help=argparse.SUPPRESS)  # internal: write the run there
    args = parser.parse_args()
    if args.make:
        make_run(args.make, args.copies)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        # Made in another process: a child forked from a large parent would count the
        # parent's pages in its peak RSS.
        subprocess.run([sys.executable, __file__, "--make", str(data), "--copies", str(args.copies)], check=True)
        chat = None
        for fmt in ("chat", "atif", "dpo", "kto", "steps"):
            out = Path(tmp) / f"out-{fmt}"
            runs = [timed_export(data, "big", out, fmt) for _ in range(args.repeat)]
            size = sum(p.stat().st_size for p in out.iterdir())
            samples = json.loads((out / "manifest.json").read_text())["samples"]
            seconds = statistics.median(r[0] for r in runs)
            chat = chat or seconds
            print(
                f"export --format {fmt}: {samples} samples in {seconds:.1f} s (median of {args.repeat}; "
                f"{seconds / chat:.2f}x chat), peak RSS {max(r[1] for r in runs) / 1e6:.0f} MB, "
                f"output {size / 1e6:.0f} MB"
            )


if __name__ == "__main__":
    main()
