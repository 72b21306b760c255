"""Working over recorded runs: each in a catalog of its own, a few at a time (:func:`over_runs`), any work on
items in order a few at a time (:func:`in_order`), and a run opened to grow (:func:`growing`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from engine.catalog import DECISION_THREADS, Catalog, sandbox
from engine.config import recorded_config
from ingest.reader import EventLog

if TYPE_CHECKING:
    from engine.config import RunConfig
    from ingest.writer import LogWriter

T = TypeVar("T")
U = TypeVar("U")


def over_runs(
    data_dir: Path, run_ids: list[str], work: Callable[[EventLog, Catalog, float], T], workers: int | None = None
) -> Iterator[T]:
    """``work(log, catalog, started)`` of each run, in run order: ``catalog`` an empty catalog of the
    run's own, ``started`` the ``time.perf_counter()`` before it was made.

    A catalog is a database of its own, its definitions copied from the instance's
    template (the views are created once, not once a run), and is detached once its
    work returns: a collection of any size is held a few runs at a time.

    Up to ``workers`` runs (default: the machine's cores) are worked on at once, each
    in a thread with its own catalog in one DuckDB instance: a run of a collection is
    ~100k events, where a statement's planning and binding, not its scan, take the
    time, and that part runs on the calling thread. Every run is checked to exist
    first; at most ``workers`` runs' catalogs are held at a time, each dropped
    once its work returns. A failure is raised when its run's turn comes (the
    runs before it were yielded).
    """
    logs = [EventLog(data_dir, run_id).require() for run_id in dict.fromkeys(run_ids)]
    con = duckdb.connect(config={"temp_directory": ""})
    sandbox(con, [Path(data_dir) / "runs"])  # the logs: no other file
    Catalog.template(con)  # made once, before the threads copy it

    def one(numbered: tuple[int, EventLog]) -> T:
        i, log = numbered
        started = time.perf_counter()
        own = con.cursor()  # a connection busy in one thread refuses another's statements
        name = f"run_{i}"
        catalog = Catalog.inside(own, name)
        try:
            return work(log, catalog, started)
        finally:
            catalog.con.close()
            own.execute(f"detach {name}")
            own.close()

    try:
        yield from in_order(list(enumerate(logs, start=1)), one, workers)
    finally:
        con.close()


def in_order(items: list[U], work: Callable[[U], T], workers: int | None = None) -> Iterator[T]:
    """``work(item)`` of each item, yielded in the items' order, up to ``workers`` (default: the machine's
    cores) at once in threads: at most ``workers`` results wait to be taken. A failure is raised when its
    item's turn comes (the results before it were yielded); the items not yet started are not."""
    workers = max(1, workers or os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="run") as pool:
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(work, item))
                if len(pending) > workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def run_finished(catalog: Catalog) -> bool:
    """Whether the run the catalog holds finished (``views/int_run__finished.sql``)."""
    return bool(catalog.query("select finished from int_run__finished")[0]["finished"])


@contextlib.contextmanager
def growing(data_dir: Path, run_id: str) -> Iterator[tuple[LogWriter, Catalog, RunConfig, bool]]:
    """A recorded run opened to grow (a resume, a campaign's run): its writer (the run's lock held), a
    catalog of its log for decisions, the config it records, and whether it finished."""
    from ingest.writer import LogWriter  # (the writer's imports: only where a run grows)

    log = EventLog(data_dir, run_id)
    with LogWriter.open(data_dir, run_id) as writer:
        catalog = Catalog.for_log(log, threads=DECISION_THREADS)
        yield writer, catalog, recorded_config(catalog, log), run_finished(catalog)
