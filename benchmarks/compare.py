"""Benchmark: this checkout against another commit, runs alternated in one script.

The machine is shared and its speed drifts over minutes, so figures are only
comparable when taken side by side. This script checks REV out into a temporary git
worktree and alternates, ``--repeat`` times, the engine benchmark (each tree count)
and a replay of two logs (the bundled pipeline and a tiled ~300-tree run, written
once by each tree, the same events) in both trees, then prints the medians and the
ratios. The engine benchmark of this checkout measures both trees.

    python benchmarks/compare.py REV [--trees 30 300] [--repeat 3] [--no-replay]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ENGINE = re.compile(
    r"= ([\d.]+) edges/s.*?p50 ([\d.]+) ms, p99 ([\d.]+) ms \(fills ([\d.]+), re-asks ([\d.na]+);"
    r".*?p50 ([\d.]+), p99 ([\d.]+)\)",
    re.S,
)
REPLAY = """
import sys, time
sys.path[:0] = [{root!r}, {root!r} + "/benchmarks"]
from pathlib import Path
from engine.replay import replay_run
from replay import floor_seconds
data = Path({data!r})
start = time.perf_counter()
result = replay_run(data, {run!r})
elapsed = time.perf_counter() - start
assert not result.differences, result.differences[:3]
print(elapsed, floor_seconds(data, {run!r}))
"""
WRITE_RUNS = """
import sys
sys.path[:0] = [{root!r}, {root!r} + "/benchmarks"]
from pathlib import Path
from replay import write_runs
write_runs(Path({data!r}), 10)
"""


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:3])} failed in {cwd}:\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the commit to compare with (e.g. HEAD~3)")
    parser.add_argument("--trees", type=int, nargs="*", default=[30, 300])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-replay", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        run(["git", "worktree", "add", "--detach", str(base), args.rev], ROOT)
        try:
            # Each tree runs its own engine benchmark (it reaches into the engine's
            # methods, which change); both print the same figures.
            trees = {"base": base, "this": ROOT}
            figures: dict[tuple[str, str], list[tuple[float, ...]]] = {}
            # Each tree writes the two logs itself (the same events: the sim is seeded),
            # since the part files' names may differ between versions (checksums).
            data = {name: Path(tmp) / f"data-{name}" for name in trees}
            if not args.no_replay:
                for name, tree in trees.items():
                    run([sys.executable, "-c", WRITE_RUNS.format(root=str(tree), data=str(data[name]))], tree)
            for _ in range(args.repeat):
                for name, tree in trees.items():
                    for n in args.trees:
                        out = run([sys.executable, "benchmarks/engine.py", "--trees", str(n)], tree)
                        m = ENGINE.search(out)
                        figures.setdefault((name, f"engine {n} trees"), []).append(tuple(float(x) for x in m.groups()))
                    for log in [] if args.no_replay else ["bundled", "big"]:
                        code = REPLAY.format(root=str(tree), data=str(data[name]), run=log)
                        out = run([sys.executable, "-c", code], tree)
                        figures.setdefault((name, f"replay {log}"), []).append(tuple(float(x) for x in out.split()))
        finally:
            run(["git", "worktree", "remove", "--force", str(base)], ROOT)
    print(f"medians of {args.repeat} alternated runs; base = {args.rev}")
    for bench in dict.fromkeys(k for _, k in figures):
        b, t = (
            [statistics.median(col) for col in zip(*figures[(name, bench)], strict=True)] for name in ("base", "this")
        )
        if bench.startswith("engine"):
            print(
                f"{bench}: {t[0]:.1f} edges/s vs {b[0]:.1f} ({t[0] / b[0]:.2f}x); selection "
                f"p50 {t[1]:.1f} vs {b[1]:.1f} ms, p99 {t[2]:.1f} vs {b[2]:.1f} ms (fills "
                f"{t[3]:.1f} vs {b[3]:.1f}, re-asks {t[4]:.1f} vs {b[4]:.1f}; queries alone p50 "
                f"{t[5]:.1f} vs {b[5]:.1f}, p99 {t[6]:.1f} vs {b[6]:.1f})"
            )
        else:
            print(
                f"{bench}: {t[0]:.2f} s vs {b[0]:.2f} s ({b[0] / t[0]:.2f}x faster); "
                f"{t[0] / t[1]:.1f}x vs {b[0] / b[1]:.1f}x the scan floor"
            )


if __name__ == "__main__":
    main()
