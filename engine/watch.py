"""Watching a run another process writes: consistent frames of its views as its log grows.

A frame is what the views say of one published prefix of the log (the catalog loads
only whole parts, and each load adds the parts published since the last one, so the
counts of successive frames never go back). New parts are noticed by watching the
log directory (watchfiles), with a periodic look as a fallback; reading needs no lock,
so the writer goes on undisturbed. The first frame is read from the run's stored
derived state (engine/derived/: caught up to the log, or derived from it).
Following ends once the run has finished, or with an error once no process writes it
any more (its writer died: nothing would ever change again, and a frozen "running"
frame would be shown for good).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import watchfiles

from engine.catalog import Catalog
from engine.runset import Reader
from ingest.errors import LogError
from ingest.listing import being_written
from ingest.log import EventLog
from ingest.paths import command_line

Row = dict[str, Any]
TREE_COLUMNS = (
    "tree_id, stage, status, stop_reason, kept_edges, good_leaves, final_leaves, root_score, "
    "best_score, in_flight_edges"
)


@dataclass
class Frame:
    """One moment of a run: progress, pace, trees and the turns in flight."""

    run_id: str
    task: str | None
    seq: int  # the last event of the prefix shown
    progress: Row
    pace: Row
    stops: dict[str, int]
    trees: list[Row]
    in_flight: list[Row]
    writing: bool = True  # a process holds the run's writer lock (an unfinished run without one is interrupted)

    @property
    def finished(self) -> bool:
        return bool(self.pace["finished"])


def read_frame(catalog: Catalog, run_id: str, writing: bool = True) -> Frame:
    """The frame of what the catalog holds (``writing``: whether a process writes the run)."""
    q = catalog.query
    stops = {r["stop_reason"]: r["trees"] for r in q("select stop_reason, trees from tree_stops order by stop_reason")}
    return Frame(
        run_id=run_id,
        task=q("select task from run_config")[0]["task"],
        seq=catalog.tail_seq(),
        progress=q("select * from run_progress")[0],
        pace=q("select * from run_pace")[0],
        stops=stops,
        trees=q(f"select {TREE_COLUMNS} from int_trees__summarized order by status = 'done', tree_id"),
        in_flight=q("select * from turns_in_flight order by since, tree_id, edge_id"),
        writing=writing,
    )


def follow(reader: Reader, run_id: str, period: float = 5.0, stop: threading.Event | None = None) -> Iterator[Frame]:
    """Frames of a run as its log grows, read through ``reader`` (the process's): one now, then one per
    change, until it finishes.

    ``period``: seconds between looks when no change is noticed (a frame is given then
    too, so the ages of turns in flight move on). ``stop`` ends following early.
    """
    log = EventLog(reader.data_dir, run_id).require()
    with reader.open(run_id) as catalog:  # the stored state, then what the writer appends
        yield from _frames(reader.data_dir, log, catalog, period, stop)


def _frames(data_dir, log: EventLog, catalog, period: float, stop: threading.Event | None) -> Iterator[Frame]:
    run_id = log.run_id
    frame = read_frame(catalog, run_id, writer_alive(log))
    yield frame
    if frame.finished:
        return
    # raise_interrupt: Ctrl-C and SIGTERM end the command as signals do (130, 143), not
    # as a run that finished (watchfiles otherwise ends its loop quietly).
    for changes in watchfiles.watch(
        log.log_dir,
        rust_timeout=int(period * 1000),
        yield_on_timeout=True,
        stop_event=stop,
        debounce=200,
        raise_interrupt=True,
    ):
        writer_gone = not changes and not writer_alive(log)  # a look with nothing new: is anyone writing?
        catalog.load(log)
        frame = read_frame(catalog, run_id, not writer_gone)
        yield frame
        if frame.finished:
            return
        if writer_gone:  # (looked at before the load: a writer that finished published first)
            raise LogError(
                f"run {run_id!r} is not finished and no process writes it any more (none holds "
                f"{log.dir / 'writer.lock'}): its writer died - continue it with: "
                f"{command_line(data_dir, 'explore', '--resume', run_id)}"
            )


def writer_alive(log: EventLog) -> bool:
    """Whether a process holds the run's writer lock (``ingest.listing.being_written``)."""
    return being_written(log.dir)
