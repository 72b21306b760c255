"""Opening a recorded run: its catalog, once the configuration it records is valid."""

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
from engine.runset import Reader
from ingest.reader import EventLog

if TYPE_CHECKING:
    from engine.config import RunConfig
    from ingest.writer import LogWriter

T = TypeVar("T")


def open_run(data_dir: Path, run_id: str, reader: Reader | None = None) -> Catalog:
    """A catalog over the published prefix of a run whose recorded config is valid, now, in memory
    (``close()`` it, or use it in a ``with``), read through ``reader`` (the process's; none: a reader of
    ``data_dir`` for this run alone).

    Its tables are read from the run's stored derived state (:mod:`engine.derived`;
    derived from the log first when none matches it, checked when read), its events
    from the log's parts. For reading only: a decision to record is derived from the
    log alone (:meth:`Catalog.for_log`). LogError names the run when it does not
    exist, and the log when its recorded config is not one this version accepts (a
    forged or damaged log: the views could not use it).
    """
    return (reader or Reader(data_dir)).open(run_id)


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
    workers = max(1, workers or os.cpu_count() or 1)
    con = duckdb.connect(config={"temp_directory": ""})
    sandbox(con, [Path(data_dir) / "runs"])  # the logs: no other file
    Catalog.template(con)  # made once, before the threads copy it

    def one(i: int, log: EventLog) -> T:
        started = time.perf_counter()
        own = con.cursor()  # a connection busy in one thread refuses another's statements
        catalog = Catalog.inside(own, f"run_{i}")
        try:
            return work(log, catalog, started)
        finally:
            catalog.con.close()
            own.execute(f"detach run_{i}")
            own.close()

    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="run") as pool:
            pending: deque = deque()
            todo = iter(enumerate(logs, start=1))
            try:
                for i, log in todo:
                    pending.append(pool.submit(one, i, log))
                    if len(pending) > workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()
    finally:
        con.close()


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
