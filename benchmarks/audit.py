"""Benchmark: `audit` and a typical `sql` query against the DuckDB scan floor of the same files.

On the replay benchmark's runs (the bundled pipeline, and a ~300-tree ~1M-event run
tiled from a 30-tree run with long turns), each measured as the command does it:
the audit (each run loaded, evaluated at every decision and queried in turn), or
opening the collection and one query. Printed: medians of --repeat, and the ratio to the
time DuckDB takes to scan every light column of the same Parquet files.

    python benchmarks/audit.py [--repeat 3] [--copies 10]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay import floor_seconds, main  # noqa: E402

from engine.audit import audit  # noqa: E402
from engine.collection import open_runs  # noqa: E402

SQL = (
    "select run_id, stratum_key as stage, n_eff_ratio, selected_paths from coverage "
    "where stratum = 'stage' order by all"
)


def timed(data: Path, run_id: str) -> tuple[float, float, float]:
    """Seconds to open the collection, to audit the run, and to open the collection and run SQL."""
    start = time.perf_counter()
    audit(data, [run_id], ("task", "stage", "depth", "lineage"))
    audited = time.perf_counter()
    runs = open_runs(data, [run_id])
    opened = time.perf_counter()
    runs.query(SQL)
    return opened - audited, audited - start, time.perf_counter() - audited


def measure(label: str, data: Path, run_id: str, repeat: int) -> None:
    floor = statistics.median(floor_seconds(data, run_id) for _ in range(repeat))
    runs = [timed(data, run_id) for _ in range(repeat)]
    opening, whole, sql = (statistics.median(r[i] for r in runs) for i in range(3))
    print(
        f"{label}: audit {whole:.2f} s ({whole / floor:.1f}x the scan floor of {floor:.3f} s), sql "
        f"{sql:.2f} s ({sql / floor:.1f}x; opening the collection {opening:.2f} s of it)"
    )


if __name__ == "__main__":
    main(measure, __doc__)
