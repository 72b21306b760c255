"""Benchmark: engine throughput and selection latency with a zero-latency sim Teacher.

For 30 and 300 trees, runs the live engine (rounds mode) over synthetic roots and
prints edges judged per second (also without the time the engine waited for the sim
Teacher's turns, which run in its thread pool on the same CPUs), and the latency of
selection decisions during the run (p50/p99): a fill's (the stop check and every
tree's next work, which first refresh the tables that the new events made stale)
and a re-ask's (the next work of the trees that started their Select winner in this
fill, asked again), also without the time spent refreshing tables, and a cold
decision measured at the end: one tree's rows made stale, then refreshed and queried.
First it prints the fixed cost of that cold decision: the same steps over a log of
one root (every statement runs over empty tables, so what is left is DuckDB planning
and starting the refresh chain and the query), the floor no data-path tuning passes.
Targets: >= 50 edges/s and p99 <= 50 ms at 300 trees.

    python benchmarks/engine.py [--trees 30 300] [--parallel 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.catalog import KIND_COLUMNS, Catalog  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from engine.mcts.explorer import Explorer  # noqa: E402
from engine.teachers.sim import SimTeacher  # noqa: E402
from ingest.events import RootAdded, RunStarted  # noqa: E402
from ingest.log import LogWriter  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def new_engine(writer: LogWriter, trees: int, parallel: int) -> Explorer:
    """A live engine over a new run of ``trees`` synthetic roots (nothing explored yet)."""
    config = RunConfig(task="bench", parallel=parallel, seed=1)
    catalog = Catalog.empty(threads=1)
    roots = [
        RootAdded(tree_id=f"T{i:03d}", task="bench", snapshot=f"s{i}", path="/x", score=1.0 + i / trees)
        for i in range(1, trees + 1)
    ]
    catalog.insert(
        writer.stage([RunStarted(command="explore", task="bench", config=config.model_dump(mode="json")), *roots])
    )
    writer.flush()
    return Explorer(writer, catalog, config, SimTeacher(config.seed))


def cold_decision(explorer: Explorer, tree: str) -> float:
    """Seconds to refresh every tree table of ``tree`` (made stale first) and ask its next work."""
    explorer.catalog.plan.arrived({kind: {tree} for kind in KIND_COLUMNS})
    t0 = time.perf_counter()
    explorer._work({tree})
    return time.perf_counter() - t0


def run(trees: int, parallel: int, data: Path) -> dict:
    latencies: list[float] = []  # a fill: the stop check, every tree's next work, the re-asks
    reasks: list[float] = []  # trees asked again within a fill
    queries: list[float] = []  # each of these without refreshing the tables
    with LogWriter.create(data, f"bench-{trees}") as writer:
        explorer = new_engine(writer, trees, parallel)
        catalog = explorer.catalog
        work, fill, refresh = explorer._work, explorer._fill, catalog.refresh
        in_fill = [False]
        refreshing = [0.0]  # time spent refreshing tables since the decision began

        def timed_refresh(*args, **kwargs):
            start = time.perf_counter()
            refresh(*args, **kwargs)
            refreshing[0] += time.perf_counter() - start

        def timed_fill(free):
            # A fill checks the stop conditions, then asks every tree's next work.
            start, refreshing[0] = time.perf_counter(), 0.0
            in_fill[0] = True
            try:
                return fill(free)
            finally:
                in_fill[0] = False
                latencies.append(time.perf_counter() - start)
                queries.append(latencies[-1] - refreshing[0])

        def timed_work(trees=None):
            if trees is None or not in_fill[0]:
                return work(trees)
            start, before = time.perf_counter(), refreshing[0]
            try:
                return work(trees)
            finally:
                reasks.append(time.perf_counter() - start)
                queries.append(reasks[-1] - (refreshing[0] - before))

        explorer._fill, explorer._work = timed_fill, timed_work
        catalog.refresh = timed_refresh
        waited = [0.0]  # the main thread blocked on Teacher results (sim CPU, GIL)
        gather = explorer.pool.gather

        def timed_gather(requests):
            results = gather(requests)
            while True:
                start = time.perf_counter()
                try:
                    facts = next(results)
                except StopIteration:
                    return
                finally:
                    waited[0] += time.perf_counter() - start
                yield facts

        explorer.pool.gather = timed_gather
        start = time.perf_counter()
        explorer.run()
        elapsed = time.perf_counter() - start
        edges = catalog.query("select count(*) as n from stg_edge_judged")[0]["n"]
        events = catalog.tail_seq()
        explorer._work = work  # cold decisions are not fills: untimed above
        tree_ids = sorted(explorer.roots)
        cold = [cold_decision(explorer, tree) for tree in tree_ids[:: max(1, trees // 20)]]
    return {
        "trees": trees,
        "edges": edges,
        "events": events,
        "seconds": elapsed,
        "edges_per_s": edges / elapsed,
        "teacher_s": waited[0],
        "engine_edges_per_s": edges / (elapsed - waited[0]),
        "fills": len(latencies),
        "reasks": len(reasks),
        "p50_ms": 1000 * pct(latencies + reasks, 0.5),
        "p99_ms": 1000 * pct(latencies + reasks, 0.99),
        "fill_p99_ms": 1000 * pct(latencies, 0.99),
        "reask_p99_ms": 1000 * pct(reasks, 0.99) if reasks else float("nan"),
        "query_p50_ms": 1000 * pct(queries, 0.5),
        "query_p99_ms": 1000 * pct(queries, 0.99),
        "cold_p50_ms": 1000 * statistics.median(cold),
        "cold_p99_ms": 1000 * pct(cold, 0.99),
    }


def fixed_cost(data: Path, reps: int = 21) -> float:
    """Median ms of the cold decision of run() over a log of one root and nothing else.

    The refresh statements and the next-work query run over empty tables: what is
    left is DuckDB's cost of planning and starting them (the floor of a decision).
    """
    with LogWriter.create(data, "bench-fixed") as writer:
        explorer = new_engine(writer, 1, 1)
        return 1000 * statistics.median(cold_decision(explorer, "T001") for _ in range(reps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, nargs="+", default=[30, 300])
    parser.add_argument("--parallel", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        floor = fixed_cost(Path(tmp))
        print(
            f"fixed cost of a decision (the cold decision below over a log of one root, "
            f"nothing explored: every statement over empty tables): p50 {floor:.1f} ms"
        )
        for trees in args.trees:
            r = run(trees, args.parallel, Path(tmp))
            print(
                f"{r['trees']:4d} trees: {r['edges']} edges, {r['events']} events in "
                f"{r['seconds']:.1f} s = {r['edges_per_s']:.1f} edges/s (target >= 50; "
                f"{r['teacher_s']:.0f} s waiting for the sim Teacher, the engine's own time alone "
                f"{r['engine_edges_per_s']:.1f} edges/s); "
                f"selection decisions ({r['fills']} fills, {r['reasks']} re-asks): "
                f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms (fills {r['fill_p99_ms']:.1f}, "
                f"re-asks {r['reask_p99_ms']:.1f}; the queries alone, tables fresh: "
                f"p50 {r['query_p50_ms']:.1f}, p99 {r['query_p99_ms']:.1f}); "
                f"cold decision p50 {r['cold_p50_ms']:.1f} ms, "
                f"p99 {r['cold_p99_ms']:.1f} ms = {r['cold_p50_ms'] / floor:.1f}x the fixed cost "
                f"(target p99 <= 50 ms)"
            )


if __name__ == "__main__":
    main()
