"""What ``verify`` says of a run's stored derived state: every state checked whole, nothing changed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.derived.files import Damaged, Outdated, check_named, is_tmp, load_json
from engine.derived.keys import SOURCE_CACHE, STATE_FILE, VERSION
from engine.derived.states import States
from engine.derived.transcripts import DIRECTORY, INDEX, code_key
from ingest.errors import LogError


@dataclass(frozen=True)
class StoredState:
    """What ``verify`` finds of one stored state (or the source cache): ``problems`` empty when whole."""

    path: Path
    variables: dict[str, Any] | None
    current: bool  # derived from the log as it is now (a reader uses it)
    problems: list[str]
    files: int
    other: str | None = None  # derived by an earlier version, other views or code: never read (a reader removes it)


def inspect(derived: States, run_id: str) -> list[StoredState]:
    """Every state stored for a run (each root), checked whole: its document, every file's digest,
    whether it was derived from the log as it is now. Nothing is changed (a reader drops what fails)."""
    try:
        now = derived.source(run_id).as_json()
    except LogError:
        now = None
    found = []
    for run in derived.run_dirs(run_id):
        cache = run / SOURCE_CACHE
        try:
            load_json(cache, f"{run_id}/{SOURCE_CACHE}")
        except Outdated:
            pass
        except Damaged as why:
            found.append(StoredState(cache, None, False, [str(why)], 1))
        for path in sorted(p for p in run.glob("*/*") if p.is_dir() and not is_tmp(p.name)):
            found.append(_inspect_one(derived.digest, run_id, path, now))
        if (run / DIRECTORY).is_dir():
            found.append(_inspect_transcripts(run_id, run / DIRECTORY, now))
    return found


def _inspect_transcripts(run_id: str, place: Path, now: dict[str, Any] | None) -> StoredState:
    """The run's searchable transcripts (engine.derived.transcripts): its index and every segment it names."""
    identity = f"{run_id}/{DIRECTORY}"
    held = _document(place, INDEX, identity)
    if isinstance(held, StoredState):
        return held
    if held.get("code") != code_key():
        return StoredState(place, None, False, [], 0, "by other code")
    try:
        segments = [place / name for name, _first, _last in held["segments"]]
    except (KeyError, TypeError, ValueError):
        return StoredState(place, None, False, [f"{INDEX} does not name its segments"], 1)
    current = now is not None and (held.get("entries"), held.get("last_sha")) == (now["entries"], now["last_sha"])
    return StoredState(place, None, current, _problems(segments, identity), len(segments) + 1)


def _inspect_one(digest: str, run_id: str, path: Path, now: dict[str, Any] | None) -> StoredState:
    relative = f"{run_id}/{path.parent.name}/{path.name}"
    held = _document(path, STATE_FILE, relative)
    if isinstance(held, StoredState):
        return held
    if held.get("format") != VERSION or held.get("digest") != digest:
        return StoredState(path, held.get("variables"), False, [], 0, "by other views or code")
    files = [path / "tables" / name for name in (held.get("tables") or {}).values()]
    files += sorted((path / "views").glob("*.parquet"))
    current = now is not None and held.get("source") == now
    return StoredState(path, held.get("variables"), current, _problems(files, relative), len(files) + 1)


def _document(place: Path, name: str, identity: str) -> dict[str, Any] | StoredState:
    """The checked document ``name`` in ``place``, or what ``verify`` says of ``place`` when it is not whole."""
    try:
        held = load_json(place / name, identity)
    except Outdated:
        return StoredState(place, None, False, [], 0, "by an earlier version")
    except Damaged as why:
        return StoredState(place, None, False, [str(why)], 0)
    return StoredState(place, None, False, [f"no {name}"], 0) if held is None else held


def _problems(files: list[Path], identity: str) -> list[str]:
    """Each file that does not hold the bytes its name records, or is missing, and why."""
    problems = []
    for file in files:
        try:
            check_named(file, identity)
        except (Damaged, FileNotFoundError) as why:
            problems.append(str(why) if isinstance(why, Damaged) else f"{file.name} is missing")
    return problems
