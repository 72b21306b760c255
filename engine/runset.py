"""The door a process reads through: its one derived state (:class:`Reader`), and which runs a command reads.

A :class:`Reader` of a data directory is the one place a process's
:class:`~engine.derived.Derived` is made: every reader of derived state in the process
(a collection's runs, one run's catalog, the transcripts, ``serve``'s pages, ``watch``,
``export``, a campaign's watch and ``verify``) reads through the reader it was given, so the views
are hashed once, one DuckDB instance builds the states, and a file checked once is not
checked again while it is unchanged. It is shared by threads (``serve``'s pages), as
:class:`~engine.derived.Derived` is.

A :class:`RunSet` is the names a user typed (runs, campaigns; none: every run), resolved once.

A campaign's name stands for its runs, in its tasks' order (its log, under
``<data>/campaigns``, lists them: the views of ``views/campaign``). Runs named must
exist, and a damaged one stays the reader's error. With none named, every run under
the data directory is read, and one a reader cannot read is diagnosed by ``verify``
and named beside the others' answers (``damaged``), unless every run is. A set reads
through its reader (the process's: given, or its own when none is).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from ingest.checks import check_part
from ingest.errors import LogError
from ingest.listing import has_log, while_moving
from ingest.listing import run_ids as runs_under
from ingest.paths import RUN_ID_RE, campaigns_dir, command_line, run_dir, under
from ingest.reader import EventLog

if TYPE_CHECKING:
    from engine.derived import Derived
    from engine.derived.transcripts import Transcripts

CAMPAIGN_VIEWS = VIEWS_DIR / "campaign"


class Reader:
    """The process's door to a data directory's derived state: the one ``derived``, made on first use (it
    takes the views' digest and opens a DuckDB instance), through which every reader of it reads."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self._derived: Derived | None = None
        self._transcripts: Transcripts | None = None
        self._lock = threading.Lock()  # (two threads' first use make one)

    @property
    def derived(self) -> Derived:
        """The derived state of the data directory (made here, once: the one place a reader makes it)."""
        with self._lock:
            if self._derived is None:
                from engine.derived import Derived

                self._derived = Derived(self.data_dir)
            return self._derived

    @property
    def transcripts(self) -> Transcripts:
        """The runs' transcripts to search, kept where the derived state is (made on first use)."""
        derived = self.derived
        with self._lock:
            if self._transcripts is None:
                from engine.derived.transcripts import Transcripts

                self._transcripts = Transcripts(derived)
            return self._transcripts

    def stamp(self, run_id: str) -> tuple:
        """What changes whenever an answer about the run may: the state of its record (it changes whenever a
        part is published) and of its live writer's mark (a collection reads a live run as of its writer's
        last state: :mod:`engine.derived.live`)."""
        from engine.derived.keys import record_stat
        from engine.derived.live import mark_stamp

        return record_stat(EventLog(self.data_dir, run_id).log_dir), mark_stamp(self.data_dir, run_id)

    def open(self, run_id: str) -> Catalog:
        """A catalog of one run's state now (:meth:`engine.derived.Derived.open`; ``close()`` it, or use it in a
        ``with``); LogError names the run when it does not exist."""
        EventLog(self.data_dir, run_id).require()
        return self.derived.open(run_id)

    def runs(self, names: list[str] | None = None) -> RunSet:
        """The runs ``names`` stand for (none: every run), read through this reader."""
        return RunSet(self.data_dir, names, self)


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


class RunSet:
    """The runs a command reads (``run_ids``, in order), those left out (``damaged``), and the ``reader``
    (its ``derived`` state) every reader of them uses."""

    def __init__(self, data_dir: Path | str, names: list[str] | None = None, reader: Reader | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.named = bool(names)
        self.run_ids = expand(self.data_dir, names) if names else runs_under(self.data_dir)
        if not self.run_ids:
            raise LogError(f"no runs {under(self.data_dir)}")
        for run_id in self.run_ids:
            if not has_log(run_dir(self.data_dir, run_id) / "log", run_id):
                raise LogError(f"run {run_id!r} not found {under(self.data_dir)}")
        self.damaged: list[DamagedRun] = []
        self.reader = reader or Reader(self.data_dir)

    @property
    def derived(self) -> Derived:
        """The process's derived state of these runs (its reader's)."""
        return self.reader.derived

    def leave_out(self, run_id: str, err: LogError) -> None:
        """A run a reader could not read: its error raised (runs named), else left out and named in
        ``damaged`` as ``verify`` diagnoses it; LogError when no run is left."""
        if self.named:
            raise err
        from ingest.integrity import verify_log  # (the log's whole check: only for a run that failed)

        verification = verify_log(EventLog(self.data_dir, run_id))
        bad = verification.first_bad
        part = bad.name if bad is not None else None
        self.damaged.append(DamagedRun(run_id, verification.problem or str(err), part, self.data_dir))
        self.run_ids.remove(run_id)
        if not self.run_ids:
            every = "\n".join(d.message() for d in self.damaged)
            raise LogError(f"every run under {self.data_dir / 'runs'} is damaged:\n{every}")

    def checked(self) -> RunSet:
        """The set once every run is checked as its readers will check it (its record, every part's checksum
        and footer), those that fail left out; runs named are as given (a reader names their damage)."""
        if not self.named:
            for run_id in list(self.run_ids):
                problem = self._unreadable(run_id)
                if problem is not None:
                    self.leave_out(run_id, LogError(problem))
        return self

    def _unreadable(self, run_id: str) -> str | None:
        """Why a reader cannot read this run (its record, a part's checksum or footer), or None.

        Files in ``log/`` the record does not name do not matter here: readers never read them.
        A run whose stored derived state was derived from its parts as they are now is not
        read again (:meth:`engine.derived.Derived.checked`).
        """

        def look() -> None:  # (again when a merge removed a part meanwhile)
            if not self.derived.checked(run_id):
                for part in EventLog(self.data_dir, run_id).parts():
                    check_part(part)

        try:
            return while_moving(run_dir(self.data_dir, run_id) / "log", look, "parts kept disappearing - try again")
        except (LogError, OSError) as err:
            return str(err)


# ---------------------------------------------------------------- a campaign's name


def is_campaign(data_dir: Path | str, name: str) -> bool:
    """Whether ``name`` is a campaign under ``data_dir`` and not a run (a run of that name comes first)."""
    if not RUN_ID_RE.match(name) or ".." in name:
        return False
    if has_log(run_dir(data_dir, name) / "log", name):
        return False
    return has_log(run_dir(campaigns_dir(data_dir), name) / "log", name)


def expand(data_dir: Path | str, names: list[str]) -> list[str]:
    """``names`` with each campaign's name replaced by its runs (in its tasks' order), each run once."""
    out: list[str] = []
    for name in names:
        out.extend(campaign_runs(Path(data_dir), name) if is_campaign(data_dir, name) else [name])
    return list(dict.fromkeys(out))


def campaign_log(data_dir: Path, name: str) -> EventLog:
    """The log of campaign ``name`` (LogError names it when it does not exist, on ``require``)."""
    return EventLog(campaigns_dir(data_dir), name)


def campaign_names(data_dir: Path) -> list[str]:
    """The campaigns under ``<data>/campaigns``, by name."""
    return runs_under(campaigns_dir(data_dir))


def open_campaign(data_dir: Path, name: str) -> Catalog:
    """A catalog of the campaign's log (views/campaign); LogError when there is no such campaign."""
    log = campaign_log(data_dir, name)
    if not log.exists():
        raise LogError(f"campaign {name!r} not found {under(data_dir, 'campaigns')}")
    catalog = Catalog.empty(CAMPAIGN_VIEWS)
    catalog.load(log)
    return catalog


def campaign_tasks(catalog: Catalog) -> list[dict[str, str]]:
    """The campaign's tasks (``task``, its run ``task_run``) in the order its file gives them."""
    return catalog.query("select task, task_run from campaign_tasks order by task_order")


def campaign_runs(data_dir: Path, name: str) -> list[str]:
    """The runs of campaign ``name``, in its tasks' order (those created so far)."""
    runs = [r["task_run"] for r in campaign_tasks(open_campaign(data_dir, name))]
    return [r for r in runs if EventLog(data_dir, r).exists()]
