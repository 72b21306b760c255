"""Read a task's ``all_snapshots/`` directory into ``SnapshotSeen`` facts (ALGORITHM §1.1-1.2, §8).

Pure file reading: nothing here decides stages or picks; that is the views' job.
Every entry of the directory gives exactly one fact, skipped ones included.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from ingest.errors import InputError
from ingest.events import SnapshotSeen, as_utf8
from ingest.schema import fits_int64

NAME_RE = re.compile(r"eval-([0-9]+)-(.+)-([0-9a-fA-F]+)")
HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
MIN_PREFIX = 7
CONFIG_CANDIDATES = (".coral/config.yaml", "config.yaml", "coral_config.yaml")


def _read_json(path: Path) -> tuple[Any, str | None]:
    """Parsed JSON of ``path`` (NaN/Infinity allowed), or a problem description."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "missing"
    except OSError as err:
        return None, f"unreadable ({err.strerror or err})"
    try:
        return json.loads(raw.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # ValueError: JSONDecodeError,
        return None, f"invalid JSON ({err})"  # or an integer of more digits than Python converts


def numeric_score(value: Any) -> tuple[float | None, str | None]:
    """The score if it is a finite int/float (not bool), else (None, why)."""
    if isinstance(value, bool):
        return None, f"score is a boolean ({json.dumps(value)})"
    if isinstance(value, int | float):
        try:
            score = float(value)
        except OverflowError:
            return None, "score is too large for a 64-bit float"
        if not math.isfinite(score):
            return None, f"score is {value}"
        return score, None
    if value is None:
        return None, "score is null"
    return None, f"score is not a number ({json.dumps(value)[:40]})"


def _attempt_files(attempts_dir: Path) -> list[Path]:
    try:
        return sorted(p for p in attempts_dir.iterdir() if p.suffix == ".json")
    except OSError:
        return []


def find_attempt(shared: Path, commit: str) -> tuple[Path | None, Any, str | None]:
    """The attempt JSON of ``commit`` in the snapshot's own ``shared/attempts``.

    Exact matches (file stem or ``commit_hash`` field) win; otherwise a unique
    prefix match in either direction whose shorter side has at least 7 hex chars.
    Returns (path, parsed JSON, problem).
    """
    attempts = shared / "attempts"
    if not attempts.is_dir():
        return None, None, "no shared/attempts directory"
    direct = attempts / f"{commit}.json"
    if direct.is_file():
        data, problem = _read_json(direct)
        field = data.get("commit_hash") if isinstance(data, dict) else None
        if problem is None and field in (None, commit):
            return direct, data, None
    exact: list[tuple[Path, Any]] = []
    prefix: list[tuple[Path, Any]] = []
    unreadable: list[str] = []
    lower = commit.lower()
    for path in _attempt_files(attempts):
        data, problem = _read_json(path)
        if problem is not None:
            if _prefix_match(path.stem.lower(), lower):
                unreadable.append(f"{path.name}: {problem}")
            continue
        field = data.get("commit_hash") if isinstance(data, dict) else None
        keys = {path.stem.lower()} | ({field.lower()} if isinstance(field, str) else set())
        if lower in keys:
            exact.append((path, data))
        elif any(_prefix_match(k, lower) for k in keys):
            prefix.append((path, data))
    for matches, label in ((exact, "exact"), (prefix, "prefix")):
        if len(matches) == 1:
            return matches[0][0], matches[0][1], None
        if len(matches) > 1:
            names = ", ".join(p.name for p, _ in matches[:3])
            return None, None, f"ambiguous attempt: {len(matches)} {label} matches ({names})"
    if unreadable:
        return None, None, f"attempt file {unreadable[0]}"
    return None, None, "no attempt JSON matches the commit"


def _prefix_match(a: str, b: str) -> bool:
    short, long = sorted((a, b), key=len)
    return len(short) >= MIN_PREFIX and HEX_RE.match(short) is not None and long.startswith(short)


def read_snapshot(path: Path, task: str) -> SnapshotSeen:
    """The fact for one directory entry of ``all_snapshots``.

    The log holds text as UTF-8: an entry whose name is not UTF-8 is skipped (and
    named with U+FFFD for the bytes it cannot hold); InputError when the directory
    holding it is named so.
    """
    name = path.name
    if as_utf8(str(path)) != str(path):
        if as_utf8(str(path.parent)) != str(path.parent):
            raise InputError(f"{as_utf8(str(path.parent))}: the path is not UTF-8 - rename it")
        return SnapshotSeen(
            task=task, snapshot=as_utf8(name), path=as_utf8(str(path)), skip_reason="folder name is not UTF-8"
        )
    base: dict[str, Any] = {"task": task, "snapshot": name, "path": str(path)}
    m = NAME_RE.fullmatch(name)
    unparseable = "unparseable folder name"
    if m and not fits_int64(int(m[1])):  # the log holds a global index as a 64-bit integer
        m, unparseable = None, "global index beyond a 64-bit integer"
    if m:
        base.update(global_index=int(m[1]), agent_id=m[2], short_hash=m[3])
    if not path.is_dir():
        return SnapshotSeen(**base, skip_reason="not a directory")
    if not m:
        return SnapshotSeen(**base, skip_reason=unparseable)
    meta_path = path / "metadata.json"
    if not meta_path.exists():
        return SnapshotSeen(**base, skip_reason="missing metadata.json")
    meta, problem = _read_json(meta_path)
    if problem is not None:
        label, _, detail = problem.partition(" (")
        where = "invalid JSON in" if label == "invalid JSON" else label
        return SnapshotSeen(**base, skip_reason=f"{where} metadata.json ({detail}")
    if not isinstance(meta, dict):
        return SnapshotSeen(**base, skip_reason="metadata.json is not a JSON object")
    commit = meta.get("commit_hash")
    commit = commit if isinstance(commit, str) and commit else None
    eval_count = meta.get("eval_count")
    base.update(
        commit_hash=commit,
        eval_count=eval_count if type(eval_count) is int and fits_int64(eval_count) else None,
    )
    if "eval_ok" not in meta:
        return SnapshotSeen(**base, skip_reason="pending: metadata.json has no eval_ok")
    raw_ok = meta["eval_ok"]
    base.update(
        eval_ok=raw_ok if isinstance(raw_ok, bool) else None,
        eval_ok_json=json.dumps(raw_ok, allow_nan=True)[:200],
    )
    if not (path / "code").is_dir():
        return SnapshotSeen(**base, skip_reason="missing code/")
    if not (path / "shared").is_dir():
        return SnapshotSeen(**base, skip_reason="missing shared/")
    if commit is None:
        return SnapshotSeen(**base, score_problem="metadata.json has no commit_hash")
    attempt_path, attempt, problem = find_attempt(path / "shared", commit)
    if attempt_path is None:
        return SnapshotSeen(**base, score_problem=problem)
    if not isinstance(attempt, dict):
        return SnapshotSeen(**base, attempt_file=attempt_path.name, score_problem="attempt JSON is not an object")
    score, problem = numeric_score(attempt.get("score"))
    status = attempt.get("status")
    return SnapshotSeen(
        **base,
        attempt_file=attempt_path.name,
        attempt_status=status if isinstance(status, str) else None,
        score=score,
        score_problem=problem,
    )


STAGES = ("early", "middle", "late")
ROOT_TEXT = ("task", "stage", "selection_reason")  # what select-snapshots adds to a copy's metadata.json
DIRECTIONS = ("maximize", "minimize")


def read_metadata(folder: Path) -> dict[str, Any]:
    """A snapshot folder's ``metadata.json`` as an object ({} when it is missing, unreadable or not one)."""
    meta, problem = _read_json(Path(folder) / "metadata.json")
    return meta if problem is None and isinstance(meta, dict) else {}


def root_problem(fact: SnapshotSeen, meta: dict[str, Any]) -> str | None:
    """Why a folder of explore's ROOTS cannot be a root (its fact and its ``metadata.json``), or None.

    A root is an eligible snapshot: ``eval_ok`` JSON true (ALGORITHM §1.8; not ``"yes"``,
    ``1`` or false, which explore took as roots before) and a numeric score. The
    fields select-snapshots adds must be text (a list-valued stage became null),
    and a stage one of the three.
    """
    if fact.eval_ok is not True:
        return f"eval_ok is {fact.eval_ok_json}, not JSON true: only a snapshot whose eval succeeded is a root"
    for key in ROOT_TEXT:
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key} in metadata.json is {json.dumps(value, allow_nan=True)[:80]}, not text"
    stage = meta.get("stage")
    if stage is not None and stage not in STAGES:
        return f"stage in metadata.json is {stage!r}, not one of {', '.join(STAGES)}"
    return None


def scan(all_snapshots: Path, task: str) -> list[SnapshotSeen]:
    """One fact per entry of ``all_snapshots``, in name order (paths absolute).

    Raises InputError when the directory does not exist or holds no folder
    named like a snapshot (it is not a snapshot run at all).
    """
    if not Path(all_snapshots).is_dir():
        raise InputError(f"{all_snapshots}: not a directory")
    root = Path(all_snapshots).resolve()  # facts hold absolute paths: a resume may start elsewhere
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as err:
        raise InputError(f"{root}: cannot list the directory ({err.strerror})") from err
    facts = [read_snapshot(Path(e.path), task) for e in entries]
    if not any(NAME_RE.fullmatch(f.snapshot) for f in facts):
        msg = (
            f"{root}: not a snapshot run - no entry is named "
            "eval-<index>-<agent_id>-<hash> (expected an all_snapshots/ directory)"
        )
        raise InputError(msg)
    return _mark_duplicates(facts)


def _mark_duplicates(facts: list[SnapshotSeen]) -> list[SnapshotSeen]:
    """Skip every candidate whose global index an earlier candidate already has."""
    first_by_index: dict[int, str] = {}
    out = []
    for fact in sorted(facts, key=lambda f: (f.global_index or 0, f.snapshot)):
        if fact.skip_reason is None and fact.global_index is not None:
            kept = first_by_index.setdefault(fact.global_index, fact.snapshot)
            if kept != fact.snapshot:
                reason = f"duplicate global index {fact.global_index} (kept {kept})"
                fact = fact.model_copy(update={"skip_reason": reason})
        out.append(fact)
    by_name = {f.snapshot: f for f in out}
    return [by_name[f.snapshot] for f in facts]


def read_direction(all_snapshots: Path, facts: list[SnapshotSeen]) -> str | None:
    """``grader.direction`` from the CORAL config the snapshots carry, if any.

    Looks for ``.coral/config.yaml``, ``config.yaml`` or ``coral_config.yaml`` in
    each candidate folder. Raises InputError if two snapshots disagree.
    """
    found: dict[str, str] = {}
    for fact in facts:
        if fact.skip_reason is not None:
            continue
        for rel in CONFIG_CANDIDATES:
            cfg = Path(fact.path) / rel
            if cfg.is_file():
                direction = grader_direction(cfg)
                if direction:
                    found[str(cfg)] = direction
                break
    values = set(found.values())
    if len(values) > 1:
        examples = ", ".join(f"{p}: {d}" for p, d in list(found.items())[:2])
        raise InputError(f"{all_snapshots}: snapshots disagree on grader.direction ({examples})")
    return values.pop() if values else None


def grader_direction(path: Path) -> str | None:
    """The ``direction`` key inside the top-level ``grader:`` block of a YAML file."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    in_grader = False
    for line in lines:
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped:
            continue
        if not line[0].isspace():
            in_grader = stripped == "grader:"
            continue
        m = re.match(r"^\s+direction:\s*['\"]?(maximize|minimize)['\"]?\s*$", stripped)
        if in_grader and m:
            return m[1]
    return None
