"""Logs for the benchmarks: runs tiled from a sim run, a run copied under another task, and scan floors.

``tile`` makes a long run from a short one (copies of its trees back to back);
``copy_run`` makes the run of another task from one run (its parts as they are,
under another run id and task name); ``scan_floor`` is the time DuckDB takes to
scan columns of a log's Parquet files, the floor a command reading them is
measured against.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.catalog import Catalog
from engine.config import RunConfig, TreeConfig
from engine.selections import default_parameters, selection_decision
from engine.supervision import default_rule, supervision_decision
from ingest.columns import LIGHT_SCHEMA
from ingest.events import RunFinished
from ingest.log import EventLog, LogWriter, encode_part, part_name, run_dir

SNAPSHOTS = Path(__file__).resolve().parent.parent / "data" / "student_run" / "all_snapshots"
ONCE = {"run_started", "snapshot_seen", "snapshots_picked", "paths_selected", "content_recorded"}
ID_COLUMNS = ("tree_id", "edge_id", "parent_id", "child_id", "node_id")


def long_turns(seed: int = 5) -> RunConfig:
    """The sim exploration the benchmarks tile: the bundled roots, turns of 11-19 tool calls a step.

    30 trees of ~3,300 events each (~100k events a run), as the trees of a real
    Teacher with dozens of tool calls a turn.
    """
    return RunConfig(
        task="kernel-speedup", parallel=16, seed=seed, backend_options={"calls_per_step": [11, 19]}, tree=TreeConfig()
    )


def tile(data: Path, src: str, dst: str, copies: int, select_at_end: bool = True) -> None:
    """Write run ``dst``: ``copies`` back-to-back copies of ``src`` with renamed trees.

    Whole-run events (config, snapshot selection, recorded contents) are kept once; each copy's seqs and
    watermarks are shifted together, so every decision still sees the same tree
    state. As at the end of an exploration, the default path and supervision selections
    over every tree and RunFinished follow the copies. With ``select_at_end=False`` the
    first copy's path selection is kept instead, which later tree facts follow (and no
    supervision selection).
    """
    drop = {"run_finished", "supervision_selected"} | ({"paths_selected"} if select_at_end else set())
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
                r2 = dict(r, run_id=dst)
                for col in ID_COLUMNS:
                    if r2[col]:
                        tree = r2[col].split("/")[0].split(".")[0]
                        r2[col] = rename[tree] + r2[col][len(tree) :]
                if r2["paths"]:  # the ids inside a recorded path selection
                    r2["paths"] = re.sub(
                        r'"(T\d+)(?=[".])', lambda m, names=rename: '"' + names[m.group(1)], r2["paths"]
                    )
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
        if select_at_end:
            writer.append([selection_decision(catalog, writer.tail, weights, top_k)])
            catalog.load(EventLog(data, dst))
            writer.append([supervision_decision(catalog, writer.tail, default_rule(catalog))])
        writer.append([RunFinished()])


def copy_run(src_data: Path, src: str, data: Path, dst: str, task: str) -> None:
    """Write run ``dst`` under ``data``: run ``src``'s parts as they are, its task renamed ``task``.

    Every part keeps its seqs, level and row groups; only the run id, the task
    columns and the task in the recorded config change, so the copy is the log an
    exploration of ``task`` with the same outcomes would have written.
    """
    log_dir = run_dir(data, dst) / "log"
    log_dir.mkdir(parents=True)
    for part in EventLog(src_data, src).parts():
        table = pq.read_table(part.path)
        run_ids = pa.array([dst] * table.num_rows, pa.string())
        table = table.set_column(table.column_names.index("run_id"), "run_id", run_ids)
        if "task" in table.column_names:
            at = table.column_names.index("task")
            old = table.column(at)
            table = table.set_column(at, "task", pc.if_else(pc.is_null(old), old, pa.scalar(task)))
        if "config" in table.column_names:
            at = table.column_names.index("config")
            configs = [_retasked(c, task) for c in table.column(at).to_pylist()]
            table = table.set_column(at, "config", pa.array(configs, pa.string()))
        encoded, digest = encode_part(table, part.level)
        (log_dir / part_name(part.first, part.last, part.level, digest)).write_bytes(encoded.to_pybytes())
    LogWriter.open(data, dst).close()  # opening checks the parts form a gapless log


def _retasked(config: str | None, task: str) -> str | None:
    if config is None:
        return None
    values = json.loads(config)
    values["task"] = task
    return json.dumps(values)


def light_columns(files: list[str]) -> list[str]:
    """The light columns of the log (in schema order) that these part files hold."""
    present: set[str] = set()
    for f in files:
        present |= set(pq.read_schema(f).names)
    return [c for c in LIGHT_SCHEMA.names if c in present]


def scan_floor(files: list[str], columns: list[str]) -> float:
    """Seconds DuckDB takes to scan ``columns`` of these Parquet files (the max of each)."""
    sql = "select " + ", ".join(f'max("{c}")' for c in columns) + " from read_parquet(?, union_by_name=true)"
    con = duckdb.connect()
    start = time.perf_counter()
    con.execute(sql, [files]).fetchall()
    return time.perf_counter() - start


def floor_seconds(data: Path, run_id: str) -> float:
    """DuckDB scanning every light column of the run's parts (max of each)."""
    files = [str(p.path) for p in EventLog(data, run_id).parts()]
    return scan_floor(files, light_columns(files))
