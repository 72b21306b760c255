"""Benchmark: how busy the engine keeps its Teacher slots, and what a decision pass costs.

A sim Teacher whose turns take ``turn_s`` seconds on average (uniform within ±50%)
runs in ``slots`` slots over ``trees`` synthetic roots; slots and turn time are scaled
alike with the trees (30 trees: 16 slots, 0.5 s; 300: 160 slots, 5 s; 3000: 1600
slots, 50 s), so the engine sees about the same 32 finished turns a second at every
size. Slot utilisation = the slot-seconds turns were running / (slots x wall time);
the ideal schedule keeps every slot busy (the issue's "ideal time = turns x mean turn
time / slots": its ratio to the wall time). Runs longer than ``--seconds`` are cut
there and measured over that window. Printed per size and schedule: utilisation,
turns, and (async) the passes of the loop - from the finished turns handed back to
the engine to its next wait - with their p50/p99.

    python benchmarks/utilisation.py [--trees 30 300 3000] [--schedule async rounds] [--seconds 120]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.catalog import Catalog  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from engine.mcts.explorer import Explorer  # noqa: E402
from engine.teachers.sim import SimTeacher  # noqa: E402
from ingest.events import RootAdded, RunStarted  # noqa: E402
from ingest.log import LogWriter  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class TimedSim(SimTeacher):
    """The sim Teacher, recording when each turn ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spans: list[tuple[float, float]] = []
        self.running: dict[int, float] = {}
        self._lock = threading.Lock()

    def run_turn(self, request, cancel):
        start = time.monotonic()
        with self._lock:
            self.running[threading.get_ident()] = start
        try:
            return super().run_turn(request, cancel)
        finally:
            with self._lock:
                self.running.pop(threading.get_ident(), None)
                self.spans.append((start, time.monotonic()))


def measure(data: Path, trees: int, schedule: str, seconds: float) -> dict:
    scale = trees / 30
    slots, turn_s = int(16 * scale), 0.5 * scale
    config = RunConfig(task="bench", parallel=slots, seed=1, schedule=schedule, backend_options={"latency_s": turn_s})
    teacher = TimedSim(config.seed, config.backend_options)
    catalog = Catalog.empty(threads=1)
    roots = [
        RootAdded(tree_id=f"T{i:04d}", task="bench", snapshot=f"s{i}", path="/x", score=1.0 + i / trees)
        for i in range(1, trees + 1)
    ]
    with LogWriter.create(data, f"u-{trees}-{schedule}") as writer:
        catalog.insert(
            writer.stage([RunStarted(command="explore", task="bench", config=config.model_dump(mode="json")), *roots])
        )
        writer.flush()
        explorer = Explorer(writer, catalog, config, teacher)
        passes: list[float] = []  # async: from the finished turns handed back to the next wait
        woke = [None]
        wait, gather = explorer.pool.wait, explorer.pool.gather

        def timed_wait():
            if woke[0] is not None:
                passes.append(time.monotonic() - woke[0])
            try:
                return wait()
            finally:
                woke[0] = time.monotonic()

        explorer.pool.wait = timed_wait
        explorer.pool.gather = gather
        timer = threading.Timer(seconds, explorer.pool.cancel.set)
        start = time.monotonic()
        timer.start()
        try:
            explorer.run()
            cut = False
        except BaseException:  # the window ended: turns were cancelled
            cut = True
        finally:
            timer.cancel()
        end = time.monotonic()
    busy = sum(min(e, end) - s for s, e in teacher.spans) + sum(end - s for s in teacher.running.values())
    return {
        "trees": trees,
        "schedule": schedule,
        "slots": slots,
        "turn_s": turn_s,
        "wall": end - start,
        "cut": cut,
        "turns": len(teacher.spans),
        "utilisation": busy / (slots * (end - start)),
        "passes": len(passes),
        "pass_p50": statistics.median(passes) if passes else float("nan"),
        "pass_p99": pct(passes, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, nargs="+", default=[30, 300, 3000])
    parser.add_argument("--schedule", nargs="+", default=["async", "rounds"])
    parser.add_argument("--seconds", type=float, default=120.0, help="the longest a run is measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for trees in args.trees:
            for schedule in args.schedule:
                r = measure(Path(tmp), trees, schedule, args.seconds)
                window = f"the first {r['wall']:.0f} s" if r["cut"] else f"the whole run, {r['wall']:.0f} s"
                print(
                    f"{r['trees']:5d} trees, {r['slots']} slots, turns of {r['turn_s']:g} s, {r['schedule']:6s}: "
                    f"slot utilisation {100 * r['utilisation']:.1f}% over {window} ({r['turns']} turns); "
                    f"{r['passes']} passes, p50 {1000 * r['pass_p50']:.0f} ms, p99 {1000 * r['pass_p99']:.0f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
