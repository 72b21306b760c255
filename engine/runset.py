"""The door a process reads through: its one derived state (:class:`Reader`), and which runs a command reads.

A :class:`Reader` of a data directory is the one place a process's
:class:`~engine.derived.Derived` is made: every reader of derived state in the process
(a collection's runs, one run's catalog, the transcripts, ``serve``'s pages, ``watch``,
``export``, a campaign's watch and ``verify``) reads through the reader it was given, so the views
are hashed once, one DuckDB instance builds the states, and a file checked once is not
checked again while it is unchanged. It is shared by threads (``serve``'s pages), as
:class:`~engine.derived.Derived` is.

A :class:`RunSet` is the names a user typed (runs, campaigns; none: every run), resolved once,
and the runs' states as it first read them (each run's stored state for a flavour, derived
together where none is; the checked files of a view's rows): a collection queries the files
its set gives it and knows nothing of how they are kept.

A campaign's name stands for its runs, in its tasks' order (its log, under
``<data>/campaigns``, lists them: the views of ``views/campaign``). Runs named must
exist, and a damaged one stays the reader's error. With none named, every run under
the data directory is read, and one a reader cannot read is diagnosed by ``verify``
and named beside the others' answers (``damaged``), unless every run is. A set reads
through its reader (the process's: given, or its own when none is).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from ingest.checks import check_part
from ingest.errors import InputError, LogError
from ingest.listing import has_log, while_moving
from ingest.listing import run_ids as runs_under
from ingest.paths import RUN_ID_RE, campaigns_dir, command_line, run_dir, under
from ingest.reader import EventLog

if TYPE_CHECKING:
    from engine.derived import Derived, Source, State
    from engine.derived.transcripts import Transcripts

CAMPAIGN_VIEWS = VIEWS_DIR / "campaign"
# Variables each run's config gives its views (its defaults, see variables.py): one value
# serves every run's views queried together, so the runs read together must agree on it.
RUN_DEFAULTS = ("knowledge_path_regex", "knowledge_command_regex")


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
        """A catalog over the published prefix of a run, now, in memory (``close()`` it, or use it in a ``with``):
        its tables read from the run's stored derived state (:meth:`engine.derived.Derived.open`: derived from the
        log first when none matches it, checked when read), its events from the log's parts. For reading only: a
        decision to record is derived from the log alone (:meth:`engine.catalog.Catalog.for_log`). LogError names
        the run when it does not exist, and the log when its recorded config is not one this version accepts."""
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
    """The runs a command reads (``run_ids``, in order), those left out (``damaged``), the ``reader`` (its
    ``derived`` state) every reader of them uses, and their states as first read (:meth:`states`,
    :meth:`view_files`: a snapshot until :meth:`refresh`)."""

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
        self._states: dict[str, dict[str, State]] = {}  # flavour (JSON) -> run -> its state
        self._files: dict[tuple[Path, str], Path] = {}  # (state, view) -> its checked file of rows

    @property
    def derived(self) -> Derived:
        """The process's derived state of these runs (its reader's)."""
        return self.reader.derived

    def leave_out(self, run_id: str, err: LogError) -> None:
        """A run a reader could not read: its error raised (runs named), else left out and named in
        ``damaged`` as ``verify`` diagnoses it; LogError when no run is left."""
        for states in self._states.values():
            states.pop(run_id, None)
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

    # -- the runs' states

    def readable(self) -> list[Path]:
        """Every directory a query over these runs reads: their logs and, in each root the derived state may use
        in this process, their stored states and the files of a view's rows of every run."""
        from engine.derived.combined import combined_dirs

        dirs = [run_dir(self.data_dir, run_id) / "log" for run_id in self.run_ids]
        dirs += [d for run_id in self.run_ids for d in self.derived.allowed_dirs(run_id)]
        return dirs + combined_dirs(self.derived)

    def refresh(self) -> None:
        """Read the runs again at the next use: a run that grew meanwhile is caught up."""
        self._states.clear()

    @property
    def read(self) -> bool:
        """Whether the runs were read (their states, of any flavour, since the last :meth:`refresh`)."""
        return bool(self._states)

    def states(
        self, at_decisions: bool = False, variables: dict[str, Any] | None = None, views: tuple[str, ...] = ()
    ) -> dict[str, State]:
        """Every readable run's state (evaluated at every decision, or now; under ``variables`` besides), built
        where none is current (with the rows of ``views``, from the catalog in hand).

        A run that cannot be read is left out and named in ``damaged`` (none named), or
        its error raised (runs named); LogError when every run is damaged. InputError when
        the runs record different patterns one value serves (:data:`RUN_DEFAULTS`).
        """
        from engine.derived import AT_DECISIONS, NOW

        variables = variables or {}
        flavour = (AT_DECISIONS if at_decisions else NOW) | variables
        key = json.dumps(flavour, sort_keys=True, default=str)
        if key not in self._states:
            states: dict[str, State] = {}

            def one(run_id: str) -> State | LogError:
                try:
                    source = self.derived.source(run_id)
                    return self._held(run_id, variables, at_decisions, source) or self.derived.state(
                        run_id, flavour, source, views
                    )
                except LogError as err:
                    return err

            # Runs with nothing stored, and runs that grew since their last state, are derived together
            # (engine/derived/batch.py); what is left (a run the batches could not take) a core each at
            # once (DuckDB works outside the GIL); results are taken in run order.
            self._derive_together(variables, flavour, at_decisions, views)
            with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(self.run_ids)))) as pool:
                found = list(pool.map(one, list(self.run_ids)))
            for run_id, state in zip(list(self.run_ids), found, strict=True):
                if isinstance(state, LogError):
                    self.leave_out(run_id, state)
                else:
                    states[run_id] = state
            _check_defaults(states)
            self._states[key] = states
        return self._states[key]

    def _held(self, run_id: str, variables: dict[str, Any], at_decisions: bool, source: Source) -> State | None:
        """A stored state to read other than the run's own under these variables (None: its own, found or
        derived)."""
        if at_decisions:
            return None
        from engine.derived import AT_DECISIONS, NOW
        from engine.derived.live import kept_state

        # final rows are the same at either: use a current state at decisions if stored
        flavour = NOW | variables
        held = self.derived.find(run_id, flavour, source) or self.derived.find(run_id, AT_DECISIONS | variables, source)
        if held is None and flavour == NOW:  # a live run: as of its writer's last state (engine/derived/live.py)
            held = kept_state(self.derived, run_id, source)
        return held

    def _derive_together(
        self, variables: dict[str, Any], flavour: dict[str, Any], at_decisions: bool, views: tuple[str, ...]
    ) -> None:
        """Derive together the states of the runs that have none to read (each a state of its own, with the rows
        of ``views``): those with nothing to start from, then those that grew since their last state."""
        wanted = []
        for run_id in self.run_ids:
            try:
                if self._held(run_id, variables, at_decisions, self.derived.source(run_id)) is None:
                    wanted.append(run_id)
            except LogError:
                continue  # (left out by the run-by-run path, which says why)
        if len(wanted) > 1:
            from engine.derived.batch import derive_together

            derive_together(self.derived, self.derived.catalogs, wanted, flavour, views)

    def view_files(
        self,
        names: list[str],
        at_decisions: bool = False,
        variables: dict[str, Any] | None = None,
        only: tuple[str, ...] | None = None,
    ) -> dict[str, tuple[str, ...]]:
        """The files of the rows of each view ``names``, of every run (or of the runs ``only``), in run order;
        every run's of a still set: one file of them all (:mod:`engine.derived.combined`).

        Each file was checked against its digest when first read, and is again whenever it
        is no longer the file checked (its size, times or inode changed): a damaged one is
        dropped and derived again from the log before it is returned.
        """
        if not names:
            return {}
        held = self.states(at_decisions, variables, tuple(names))
        for run_id in only or ():
            if run_id not in held:
                raise InputError(f"run {run_id!r} is not one of the collection's runs ({', '.join(held)})")
        wanted = list(only) if only is not None else list(held)
        stale = [r for r in wanted if any(not self._checked_file(held[r], v) for v in names)]
        if len(stale) > 1:  # each view evaluated once for many runs' states, not once a run
            from engine.derived.batch import view_rows_together

            lacking: dict[str, tuple[State, tuple[str, ...]]] = {}
            for run in stale:  # (a view's file stored already is read as it is, checked)
                views = [v for v in names if not self._checked_file(held[run], v)]
                lacking[run] = (held[run], tuple(v for v in views if self.derived.stored_view(held[run], v) is None))
            together = view_rows_together(
                self.derived, self.derived.catalogs, {r: w for r, w in lacking.items() if w[1]}
            )
            for run, paths in together.items():
                for view, path in paths.items():
                    self._files[(held[run].dir, view)] = path
            stale = [r for r in stale if any(not self._checked_file(held[r], v) for v in names)]

        def one(run: str) -> LogError | None:
            try:
                for view in names:
                    if not self._checked_file(held[run], view):
                        state, path = self.derived.view_rows(held[run], view)
                        self._files[(state.dir, view)] = path
                        if state is not held[run]:  # found damaged and derived again: its other files too
                            held[run] = state
                            return one(run)
            except LogError as err:  # (its parts damaged since its state was derived)
                return err
            return None

        if len(stale) > 1:  # a core each (DuckDB works outside the GIL)
            with ThreadPoolExecutor(min(os.cpu_count() or 1, len(stale))) as pool:
                found = list(pool.map(one, stale))
        else:
            found = [one(run) for run in stale]
        for run, err in zip(stale, found, strict=True):
            if err is not None:
                self.leave_out(run, err)
                wanted.remove(run)
        files = {name: tuple(str(self._files[(held[run].dir, name)]) for run in wanted) for name in names}
        if only is None and len(wanted) > 1:  # every run's rows: one file, once the runs are still
            from engine.derived.combined import combined_file

            for name, listed in files.items():
                whole = combined_file(self.derived, self.derived.con, name, list(listed))
                if whole is not None:
                    files[name] = (whole,)
        return files

    def _checked_file(self, state: State, view: str) -> bool:
        path = self._files.get((state.dir, view))
        return path is not None and self.derived.checks.unchanged(path)


def _check_defaults(states: dict[str, State]) -> None:
    """InputError when the runs record different values of a variable one value serves (:data:`RUN_DEFAULTS`)."""
    for name in RUN_DEFAULTS:
        found = {s.values.get(name) for s in states.values()}
        if len(found) > 1:
            msg = (
                f"the runs {', '.join(states)} record different {name.replace('_', '.', 1)} "
                "patterns - read them in separate collections"
            )
            raise InputError(msg)


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
