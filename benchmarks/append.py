"""Benchmark: durable appends to the log, against rewriting the whole tree as one JSON document.

Two figures of the log's writer (`ingest/log.py`: each flush writes a Parquet part,
fsyncs it, renames it into place and fsyncs the directory; eight parts of a level
merge into one of the next):

- batched: events per second appending batches of ``--batch`` tool-call events;
- per turn: the latency of publishing one turn's facts (~30 events: tool calls,
  steps, eval, TurnFinished) as the log grows, p50 and p99 over each stretch of turns.

The baseline persists the search as many tree-search agents do: after every expansion
the whole tree (every node with its turns' facts) is serialized to one JSON document,
written to a temporary file, fsynced and renamed over the old one. Its cost grows with
the tree (it runs up to 1,000 turns); the log's does not.

    python benchmarks/append.py [--turns 100 1000 10000] [--batch 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.events import EvalFinished, RunStarted, StepFinished, ToolCalled, TurnFinished  # noqa: E402
from ingest.log import LogWriter  # noqa: E402

JSON_TURNS = 1000  # the baseline's rewrites grow with the tree: 10,000 turns would take hours


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def turn_facts(i: int) -> list:
    edge = f"T001.{i}/e1-1"
    ids = {"tree_id": "T001", "edge_id": edge, "turn": 1}
    facts = [
        ToolCalled(**ids, step=1 + c // 5, call_id=f"c{i}-{c}", tool="read", status="ok", target=f"src/file{c}.py")
        for c in range(24)
    ]
    facts += [StepFinished(**ids, step=s, tokens_total=1000 * s) for s in range(1, 5)]
    facts += [EvalFinished(**ids, score=1.0 + i / 1e6), TurnFinished(**ids, context_tokens=20_000, state={"i": i})]
    return facts


def batched(data: Path, batch: int, batches: int = 10) -> float:
    facts = [f for i in range(batch // 30 + 1) for f in turn_facts(i)][:batch]
    with LogWriter.create(data, "batched") as writer:
        writer.append([RunStarted(command="bench")])
        start = time.perf_counter()
        for _ in range(batches):
            writer.append(facts)
        return batch * batches / (time.perf_counter() - start)


def per_turn_log(data: Path, turns: int) -> list[float]:
    out = []
    with LogWriter.create(data, f"turns-{turns}") as writer:
        writer.append([RunStarted(command="bench")])
        for i in range(turns):
            facts = turn_facts(i)
            start = time.perf_counter()
            writer.append(facts)
            out.append(time.perf_counter() - start)
    return out


def per_turn_json(path: Path, turns: int) -> list[float]:
    tree: dict = {"nodes": []}
    out = []
    for i in range(turns):
        tree["nodes"].append({"id": f"T001.{i}", "facts": [f.model_dump() for f in turn_facts(i)]})
        start = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(tree, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        print(f"batched: {batched(data, args.batch):,.0f} events/s (batches of {args.batch:,} events)")
        for turns in args.turns:
            log = per_turn_log(data, turns)
            doc = per_turn_json(data / f"tree-{turns}.json", turns) if turns <= JSON_TURNS else None
            tail = slice(-max(1, turns // 10), None)  # the last tenth: the tree at its size
            line = (
                f"{turns:6d} turns (~30 events each): log p50 {1000 * statistics.median(log):.1f} ms, "
                f"p99 {1000 * pct(log, 0.99):.1f} ms, last tenth p50 {1000 * statistics.median(log[tail]):.1f} ms"
            )
            if doc:
                line += (
                    f"; one JSON document: p50 {1000 * statistics.median(doc):.1f} ms, last tenth p50 "
                    f"{1000 * statistics.median(doc[tail]):.1f} ms "
                    f"({statistics.median(doc[tail]) / statistics.median(log[tail]):.1f}x the log)"
                )
            print(line, flush=True)


if __name__ == "__main__":
    main()
