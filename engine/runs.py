"""Opening a recorded run: its catalog, once the configuration it records is valid."""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from engine.catalog import DECISION_THREADS, Catalog
from engine.config import recorded_config as recorded_config  # (where runs are opened)
from ingest.checks import check_part
from ingest.errors import LogError
from ingest.paths import command_line, under
from ingest.reader import EventLog
from ingest.reader import run_ids as runs_under

if TYPE_CHECKING:
    from engine.config import RunConfig
    from ingest.writer import LogWriter

T = TypeVar("T")


def open_run(data_dir: Path, run_id: str) -> Catalog:
    """A catalog over the published prefix of a run whose recorded config is valid, now, in memory
    (``close()`` it, or use it in a ``with``).

    Its tables are read from the run's stored derived state (:mod:`engine.derived`;
    derived from the log first when none matches it, checked when read), its events
    from the log's parts. For reading only: a decision to record is derived from the
    log alone (:meth:`Catalog.for_log`). LogError names the run when it does not
    exist, and the log when its recorded config is not one this version accepts (a
    forged or damaged log: the views could not use it).
    """
    from engine.derived import Derived

    EventLog(data_dir, run_id).require()
    return Derived(data_dir).open(run_id)


@dataclass(frozen=True)
class DamagedRun:
    """A run under --data that ``verify`` finds damaged: left out of an all-runs command, named at its end."""

    run_id: str
    problem: str  # verify's diagnosis
    part: str | None  # the part to quarantine (the first damaged one), when verify names one
    data_dir: Path | str = "data"  # where the run lies (the hint names a --data other than ./data)

    def message(self) -> str:
        hint = command_line(self.data_dir, "quarantine", self.run_id, self.part) if self.part else ""
        fix = f" - move it aside (the intact prefix stays readable): {hint}" if hint else ""
        return f"run {self.run_id} is damaged and was not read: {self.problem}{fix}"


def runs_to_read(data_dir: Path, run_ids: list[str] | None) -> tuple[list[str], list[DamagedRun]]:
    """The runs an all-runs command reads, and the damaged ones it leaves out.

    Runs named (``run_ids``): as given, in that order (a campaign's name: its runs),
    none left out - a damaged one stays the reader's error. None named: every run under ``data_dir``, each checked
    as its readers will check it (its record, and every part's checksum and footer),
    and one that fails is diagnosed by ``verify`` and named beside the others'
    answers instead of hiding them. LogError when there is no run, or when every run
    is damaged.
    """
    if run_ids:
        from engine.campaign.names import expand

        return expand(data_dir, run_ids), []
    from engine.derived import Derived

    found = runs_under(data_dir)
    if not found:
        raise LogError(f"no runs {under(data_dir)}")
    derived = Derived(data_dir)
    readable, damaged = [], []
    for run_id in found:
        problem = _unreadable(data_dir, run_id, derived)
        if problem is None:
            readable.append(run_id)
        else:
            damaged.append(diagnosed(data_dir, run_id, problem))
    if not readable:
        raise LogError(
            "every run under "
            + str(Path(data_dir) / "runs")
            + " is damaged:\n"
            + "\n".join(d.message() for d in damaged)
        )
    return readable, damaged


def diagnosed(data_dir: Path, run_id: str, problem: str) -> DamagedRun:
    """A run a reader could not read (``problem``), as ``verify`` diagnoses it."""
    from ingest.integrity import verify_log  # (the log's whole check: not what opening a run needs)

    verification = verify_log(EventLog(data_dir, run_id))
    bad = verification.first_bad
    return DamagedRun(run_id, verification.problem or problem, bad.name if bad is not None else None, data_dir)


def _unreadable(data_dir: Path, run_id: str, derived) -> str | None:
    """Why a reader cannot read this run (its record, a part's checksum or footer), or None.

    Files in ``log/`` the record does not name do not matter here: readers never read them.
    A run whose stored derived state was derived from its parts as they are now is not
    read again (:meth:`engine.derived.Derived.checked`).
    """
    for _look in range(3):  # a part a merge removed meanwhile: look again
        try:
            if derived.checked(run_id):
                return None
            for part in EventLog(data_dir, run_id).parts():
                check_part(part)
            return None
        except FileNotFoundError as err:
            problem = str(err)
        except (LogError, OSError) as err:
            return str(err)
    return problem


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
    con = duckdb.connect()
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
