"""Writing derived state: a refreshed catalog's tables and views as digest-named files, its state.json, the
stored state a new one may start from, and what no reader will read again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from engine.catalog import Catalog
from engine.derived.files import (
    MAX_DOCUMENT,
    Damaged,
    dump_json,
    load_json,
    read_regular,
    sweep_tmp,
    write_named,
)
from engine.derived.keys import (
    AT_DECISIONS,
    KEPT_FLAVOURS,
    NOW,
    STATE_FILE,
    VERSION,
    WIDE_INTEGERS,
    Source,
    State,
    flavour_key,
    source_from,
)
from ingest.paths import TMP_MARK, fsync_dir
from ingest.text import sql_text

if TYPE_CHECKING:  # (a type only: the log's reader loads Arrow, which reading stored state never needs)
    from ingest.reader import EventLog


def write_state(
    catalog: Catalog,
    tmp: Path,
    relative: str,
    source: Source,
    variables: dict[str, Any],
    digest: str,
    *,
    views: tuple[str, ...] = (),
    batch: dict[str, str] | None = None,
) -> None:
    """Write the state of a refreshed catalog into ``tmp``: its tables' rows (and the rows of ``views``), then
    state.json, all fsynced. ``batch``: the catalog holds other runs too, only this run's rows are written, and
    a view named there is read from the relation named (its rows of every run, evaluated once)."""
    (tmp / "tables").mkdir()
    (tmp / "views").mkdir()
    tables = {}
    only = f"run_id = {sql_text(source.run_id)}" if batch is not None else ""
    for name in catalog.tables:
        tables[name] = write_rows(catalog.con, tmp / "tables", name, relative, where=only).name
    for view in views:
        rows = (batch or {}).get(view, view)
        write_rows(catalog.con, tmp / "views", view, relative, run=source.run_id, where=only, relation=rows)
    body = {
        "format": VERSION,
        "run_id": source.run_id,
        "source": source.as_json(),
        "digest": digest,
        "variables": variables,
        "values": catalog.variables.values,
        "explicit": sorted(catalog.variables.explicit),
        "tables": tables,
    }
    body = json.loads(json.dumps(body, default=str))  # as read back
    (tmp / STATE_FILE).write_text(dump_json(relative, body))
    with open(tmp / STATE_FILE, "rb") as fh:
        os.fsync(fh.fileno())
    for directory in (tmp / "tables", tmp / "views", tmp):
        fsync_dir(directory)


def write_rows(
    con: duckdb.DuckDBPyConnection,
    directory: Path,
    name: str,
    relative: str,
    *,
    run: str | None = None,
    where: str = "",
    relation: str | None = None,
) -> Path:
    """The rows of relation ``name`` (a table, or a view with ``run_id`` added first when ``run``; those
    ``where`` holds, when given and the rows have a ``run_id``; read from ``relation`` when given, a copy of
    them) as a digest-named Parquet file in ``directory``."""
    relation = relation or name
    described = con.execute(f"select * from {relation} limit 0").description
    names = [d[0] for d in described]
    first = f"{sql_text(run)} as run_id, " if run is not None and "run_id" not in names else ""
    # Parquet has no 128-bit integer: a sum DuckDB types HUGEINT would come back a
    # DOUBLE (1714.0). Stored as BIGINT, it reads back the integer it is.
    cols = ", ".join(
        f'cast("{n}" as bigint) as "{n}"' if str(t) in WIDE_INTEGERS else f'"{n}"' for n, t, *_ in described
    )
    rows = f"select {first}{cols} from {relation}" + (f" where {where}" if where and "run_id" in names else "")
    copy = f"copy ({rows}) to {{}} (format parquet, compression zstd)"
    return write_named(directory, name, relative, lambda tmp: con.execute(copy.format(sql_text(tmp))))


def publish(tmp: Path, final: Path) -> bool:
    """Rename a built state into place; False when another reader's is there already (theirs is used)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():
            return False
        raise
    return True


def set_flavour(catalog: Catalog, variables: dict[str, Any]) -> None:
    """Set the flavour's variables where they differ, and reset those a base's caller set that this
    flavour does not (each makes the tables reading it stale)."""
    changed = {k: v for k, v in variables.items() if catalog.variables.values.get(k) != v}
    held = catalog.variables.values
    changed |= {k: None for k in catalog.variables.explicit - set(variables) if k in held}
    if changed:
        catalog.variables.set(**changed)


def base_state(
    run_dirs: list[Path], log: EventLog, flavour: str, now: Source, digest: str, tables: list[str]
) -> State | None:
    """A stored state a new one may start from: this flavour's, of a record this one extends,
    whose parts that are still live are the files they were (same size and time; a part
    changed in place sends the run back to its log, where its checksum is checked).

    Else such a state under other variables (the tables the variables that differ
    make stale are recomputed), else None (built from the log).
    """
    record = log.record()
    if record is None:
        return None
    candidates = []
    live = {name: stat for name, *stat in now.parts}
    for run in run_dirs:
        for path in sorted(run.glob(f"*/*/{STATE_FILE}")):
            relative = f"{log.run_id}/{path.parent.parent.name}/{path.parent.name}"
            try:
                held = load_json(path, relative)
                src = source_from(held["source"])  # type: ignore[index]
            except (Damaged, KeyError, TypeError, ValueError):
                continue
            if held.get("format") != VERSION or held.get("digest") != digest or src.run_id != log.run_id:
                continue
            if src.identity != record.identity or not record.extends(src.entries, src.last_sha):
                continue
            if any(live.get(name, stat) != stat for name, *stat in src.parts):
                continue
            if set(held.get("tables") or {}) != set(tables):
                continue
            same = path.parent.parent.name == flavour
            state = State(
                src.run_id,
                path.parent,
                src,
                held.get("variables") or {},
                held["values"],
                set(held["explicit"]),
                dict(held["tables"]),
            )
            candidates.append((same, src.entries, state))
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def collect(flavour: Path, keep: State, digest: str) -> None:
    """Remove what no reader of these views will read again: the flavour's states but ``keep``
    and the newest other (a reader may still be scanning one just replaced: one that finds
    its files gone reads again), the run's flavours derived by other views or code, all but
    the newest KEPT_FLAVOURS others of variables set by a caller (now and at decisions stay),
    and the temporary files and directories writers that are gone left (:func:`sweep_tmp`)."""
    run = flavour.parent
    mine = {flavour_key(digest, NOW), flavour_key(digest, AT_DECISIONS), flavour.name}
    others = []
    for path in run.iterdir():
        if path.name.startswith(TMP_MARK) or not path.is_dir():
            continue
        states = sorted(((_mtime(p), p.parent) for p in path.glob(f"*/{STATE_FILE}")), reverse=True)
        if not states:  # nothing stored yet (another reader may be building its first state)
            continue
        if _digest_of(states[0][1]) != digest:
            shutil.rmtree(path, ignore_errors=True)
        elif path == flavour:
            for _when, old in [s for s in states if s[1] != keep.dir][1:]:
                shutil.rmtree(old, ignore_errors=True)
        elif path.name not in mine:
            others.append((states[0][0], path))
    for _when, path in sorted(others, reverse=True)[KEPT_FLAVOURS:]:
        shutil.rmtree(path, ignore_errors=True)
    sweep_tmp(run)


def _digest_of(state_dir: Path) -> str | None:
    try:
        return json.loads(read_regular(state_dir / STATE_FILE, MAX_DOCUMENT)).get("digest")
    except (OSError, ValueError, AttributeError, RecursionError, Damaged):
        return None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
