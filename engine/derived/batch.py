"""A collection's runs derived together: a catalog holding many, refreshed once, a state written per run.

Every view carries ``run_id`` first (docs/DECISIONS.md, "Every view keyed by run_id first"),
so one catalog can hold many runs: each refresh statement is planned and bound once for
all of them instead of once a run, which at a run's size costs about what running it does.
Each run's state is then written from its own rows and is the state a catalog of that run
alone derives (a test compares them file by file); it is stored, checked and read as any.
The views a reader asked for are evaluated once for the catalog too, and each run's state
holds its rows of them, so the query that found the runs cold reads them as they are.
The runs are split over the cores, a catalog each, built at once: planning a statement and
the Python around it take one core however many runs a catalog holds.

Runs with nothing to start from (no state of theirs stored, none a catch-up could extend)
are derived from their logs; runs that grew since a state of theirs was stored are caught up
from those states together. Runs caught up together are grouped by the defaults their configs
give the views' variables (one value serves a catalog); a catalog of new runs whose defaults
differ is given up. Anything that goes
wrong here leaves the runs to the run-by-run path, which names a damaged run's problem as it
always has.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb

from engine.derived.catalogs import Catalogs
from engine.derived.files import Damaged
from engine.derived.keys import Source, State, flavour_key
from engine.derived.states import States
from engine.derived.store import base_state, set_flavour, write_rows
from ingest.errors import LogError
from ingest.listing import Moved
from ingest.text import sql_text

__all__ = ["CHUNK_EVENTS", "derive_together", "view_rows_together"]

# Events a catalog of runs derived together holds at most: its memory is about the runs'
# light columns and tables (measured at ~1M events: see benchmarks/README.md), so a large
# collection is derived a million events at a time.
CHUNK_EVENTS = 1_000_000


def derive_together(
    derived: States,
    catalogs: Catalogs,
    run_ids: list[str],
    variables: dict[str, Any],
    views: tuple[str, ...] = (),
) -> list[str]:
    """Derive and store together the states under ``variables`` (with the rows of ``views``) of those of
    ``run_ids`` that have none for their log as it is now: runs with nothing stored to start from, from their
    logs; runs that grew since a state of theirs under these variables was stored, caught up from it (restored,
    their new events loaded, only the trees those concern recomputed, each statement once for every run of the
    catalog). In a catalog a core, each of CHUNK_EVENTS at most and two runs at least (``catalogs``: where they
    are made), the runs split in their order. The runs stored so; the others (a base found damaged, runs that do
    not share a catalog) are the run-by-run path's."""
    from ingest.reader import EventLog

    cold: dict[str, Source] = {}
    bases: dict[str, State] = {}
    grown: dict[str, dict[str, Source]] = {}  # the runs a restore can hold together (one set of values)
    for run_id, (source, base) in _lacking(derived, run_ids, variables).items():
        if base is None:
            cold[run_id] = source
        elif base.variables == variables:  # (a state under other variables: the run-by-run path reflavours it)
            bases[run_id] = base
            key = json.dumps([base.values, sorted(base.explicit)], sort_keys=True, default=str)
            grown.setdefault(key, {})[run_id] = source

    def caught_up(catalog: Any, runs: dict[str, Source]) -> bool:
        logs = {run_id: EventLog(derived.data_dir, run_id) for run_id in runs}
        files: dict[str, list[Path]] = {}
        for run_id in runs:
            for name, path in derived.checked_tables(bases[run_id]).items():
                files.setdefault(name, []).append(path)
        first = bases[next(iter(runs))]
        catalog.restore([(logs[r], bases[r].source.tail) for r in runs], files, first.values, set(first.explicit))
        if any(catalog.tail_seq(r) != bases[r].source.tail for r in runs):
            return False  # (parts quarantined since)
        catalog.load_runs([(logs[r], source.tail) for r, source in runs.items()])  # (one scan of the new events)
        if any(catalog.tail_seq(r) != source.tail for r, source in runs.items()):
            return False
        set_flavour(catalog, variables)
        catalog.refresh()
        for run_id, source in runs.items():
            derived.loaded[run_id] += source.tail - bases[run_id].source.tail
        return True

    work = [("cold", lambda c, runs: _load(derived, c, runs, variables), cold)]
    work += [("caught_up", caught_up, group) for group in grown.values()]
    return _together(derived, catalogs, work, variables, views)


def _lacking(derived: States, run_ids: list[str], variables: dict[str, Any]) -> dict[str, tuple[Source, State | None]]:
    """The runs with no state under ``variables`` for their log as it is now: each one's source, and the stored
    state a new one would start from (None: nothing, it is derived from its log). A run that cannot be read is
    left out (the run-by-run path says what is wrong with it)."""
    from ingest.reader import EventLog

    flavour = flavour_key(derived.digest, variables)
    found: dict[str, tuple[Source, State | None]] = {}
    for run_id in run_ids:
        try:
            source = derived.source(run_id)
            if derived.find(run_id, variables, source) is None:
                log = EventLog(derived.data_dir, run_id)
                base = base_state(derived.run_dirs(run_id), log, flavour, source, derived.digest, derived.tables)
                found[run_id] = (source, base)
        except (LogError, OSError):
            continue
    return found


def _together(
    derived: States,
    catalogs: Catalogs,
    work: list[tuple[str, Callable[[Any, dict[str, Source]], bool], dict[str, Source]]],
    variables: dict[str, Any],
    views: tuple[str, ...],
) -> list[str]:
    """Each ``(how, fill, runs)`` of ``work``: the runs in catalogs of two runs or more, a core's share of them
    each, all built at once: each catalog filled and refreshed by ``fill`` (False: the runs cannot share it), then
    a state stored per run (built ``how``; with the rows of ``views``, evaluated once for them all). The runs
    stored so."""

    def one(how: str, fill: Callable[[Any, dict[str, Source]], bool], chunk: dict[str, Source]) -> list[str]:
        stored: list[str] = []
        held = catalogs.new()
        try:
            if fill(held.catalog, chunk):
                held.how = how
                batch = {}
                for view in views:  # every run's rows at once, then each run's copied from them
                    batch[view] = f'"batch__{view}"'
                    held.catalog.con.execute(f"create temp table {batch[view]} as select * from {view}")
                for source in chunk.values():
                    stored.append(derived.store(held, source, variables, views, batch).run_id)
        except (Damaged, Moved, LogError, OSError, duckdb.Error):
            pass  # (the runs not stored are the run-by-run path's)
        finally:
            held.close()
        return stored

    cores = os.cpu_count() or 1
    chunks = [
        (how, fill, chunk)
        for how, fill, runs in work
        for chunk in _chunks(runs, parts=min(cores, len(runs) // 2))
        if len(chunk) > 1
    ]
    # A catalog a core (DuckDB works outside the GIL): a statement's planning and binding, and the Python
    # around it, use one core however many runs the catalog holds.
    with ThreadPoolExecutor(max(1, min(cores, len(chunks)))) as pool:
        return [run_id for stored in pool.map(lambda c: one(*c), chunks) for run_id in stored]


def _chunks(cold: dict[str, Source], parts: int = 1) -> list[dict[str, Source]]:
    """The runs in catalogs of at most CHUNK_EVENTS events each (a run larger than that alone), in run order;
    ``parts``: in about that many catalogs of about as many events each (one a core)."""
    share = -(-sum(s.tail for s in cold.values()) // max(1, parts))  # (the events a part, rounded up)
    chunks: list[dict[str, Source]] = [{}]
    for run_id, source in cold.items():
        held = sum(s.tail for s in chunks[-1].values())
        if chunks[-1] and (held + source.tail > CHUNK_EVENTS or held >= share):
            chunks.append({})
        chunks[-1][run_id] = source
    return chunks


def _load(derived: States, catalog: Any, cold: dict[str, Source], variables: dict[str, Any]) -> bool:
    """Load every run's source into ``catalog`` and refresh it under ``variables``; False when the runs
    cannot share it."""
    from engine.config import defaults_agree, recorded_config
    from ingest.reader import EventLog

    logs = {run_id: EventLog(derived.data_dir, run_id) for run_id in cold}
    catalog.load_runs([(logs[run_id], source.tail) for run_id, source in cold.items()])  # (one scan of all)
    for run_id, source in cold.items():
        recorded_config(catalog, logs[run_id])
        if catalog.tail_seq(run_id) != source.tail:  # its parts quarantined meanwhile
            return False
    if not defaults_agree(catalog):
        return False
    set_flavour(catalog, variables)
    catalog.refresh()
    for run_id, source in cold.items():
        derived.loaded[run_id] += source.tail
    return True


def view_rows_together(
    derived: States, catalogs: Catalogs, wanted: dict[str, tuple[State, tuple[str, ...]]]
) -> dict[str, dict[str, Path]]:
    """Write, for each run, the rows of the views its stored state lacks (``wanted[run] = (state, views)``)
    from one catalog holding the states of many runs, read where they lie (CHUNK_EVENTS at most, states of
    the same variables), each view evaluated once for them all; by run, the files written and checked. A
    state left out, or a batch that fails, is the run-by-run path's (each state's own catalog; ``catalogs``: where
    the one catalog is made)."""
    from ingest.reader import EventLog

    groups: dict[str, dict[str, Source]] = {}
    for run_id, (state, _views) in wanted.items():
        key = json.dumps([state.variables, state.values, sorted(state.explicit)], sort_keys=True, default=str)
        groups.setdefault(key, {})[run_id] = state.source
    written: dict[str, dict[str, Path]] = {}
    for group in groups.values():
        for chunk in _chunks(group):
            if len(chunk) < 2:
                continue
            states = [wanted[run_id][0] for run_id in chunk]
            held = catalogs.new()
            try:
                files: dict[str, list[Path]] = {}
                for state in states:
                    for name, path in derived.checked_tables(state).items():
                        files.setdefault(name, []).append(path)
                logs = [(EventLog(derived.data_dir, s.run_id), s.source.tail) for s in states]
                held.catalog.restore(logs, files, states[0].values, set(states[0].explicit), in_place=True)
                if any(held.catalog.tail_seq(s.run_id) != s.source.tail for s in states):
                    continue  # (parts quarantined since: the run-by-run path derives those states again)
                for view in sorted(set().union(*(wanted[run_id][1] for run_id in chunk))):
                    held.catalog.con.execute(f'create temp table "batch__{view}" as select * from {view}')
                for state in states:
                    directory = state.dir / "views"
                    directory.mkdir(parents=True, exist_ok=True)
                    only = f"run_id = {sql_text(state.run_id)}"
                    for view in wanted[state.run_id][1]:
                        rows = f'"batch__{view}"'
                        path = write_rows(
                            held.catalog.con,
                            directory,
                            view,
                            state.relative,
                            run=state.run_id,
                            where=only,
                            relation=rows,
                        )
                        derived.checks.check(path, state.relative)  # as written, now known checked
                        written.setdefault(state.run_id, {})[view] = path
            except (Damaged, LogError, OSError, duckdb.Error):
                continue
            finally:
                held.close()
    return written
