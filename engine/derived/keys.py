"""What a stored state is keyed by: the run's source (its record and parts, as read now), the
flavour (the views' and the deriving code's digest, and the variables), and where a state lies.

Light on purpose (no Arrow, no pydantic): a warm read computes these for every run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.definitions import VIEWS_DIR
from ingest.listing import Moved, located, while_moving
from ingest.paths import file_signature, run_dir
from ingest.record import RECORD, read_record

DERIVED = "derived"
# Bump to rebuild every stored state (the code deriving a state is in its key too: CODE).
VERSION = 3  # 2: no events in a state; tables as Parquet; every file checked by its digest. 3: digests keyed (HMAC)
ROOT = Path(__file__).resolve().parent.parent.parent
# The code a state is derived by: the event schema and the log's reading (ingest/), the
# catalog (its tables, their refresh), the check of the recorded config and this module.
# Its source is part of every state's key, so a state derived by other code is never read.
CODE = ("ingest/*.py", "engine/catalog/*.py", "engine/derived/*.py", "engine/runs.py", "engine/config.py")
NOW = {"asof_points": "now"}
AT_DECISIONS = {"asof_points": "decisions"}
WIDE_INTEGERS = ("HUGEINT", "UHUGEINT")
KEPT_FLAVOURS = 4  # per run, besides now and at decisions: the newest states of variables a caller set
SOURCE_CACHE = "source.json"  # per run: its source as last parsed from its record
STATE_FILE = "state.json"


def views_digest(views_dir: Path = VIEWS_DIR) -> str:
    """The digest of what derives a state: every view file (the macros too), the code (CODE), VERSION."""
    h = hashlib.sha256(f"v{VERSION}\n".encode())
    code = sorted({p for pattern in CODE for p in ROOT.glob(pattern)})
    for path in [*code, *sorted(Path(views_dir).glob("*.sql"))]:
        h.update(f"\n{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def flavour_key(digest: str, variables: dict[str, Any]) -> str:
    """The directory name of the states derived by these views under these variables."""
    text = json.dumps(variables, sort_keys=True, default=str)
    return hashlib.sha256(f"{digest}\n{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Source:
    """What a run's state is derived from: its committed record of parts, as read now."""

    run_id: str
    identity: str  # the record's first entry ("" for a run written before records)
    entries: int
    last_sha: str
    tail: int
    parts: tuple[tuple[str, int, int], ...]  # (name, size, mtime_ns) of each live part, in seq order

    @classmethod
    def of(cls, data_dir: Path, run_id: str) -> Source:
        """The source of a run's log now; LogError when its record or parts cannot be read.

        Reads the record and lists its parts (no part is opened); a run written before
        records is listed by its reader.
        """
        log_dir = run_dir(data_dir, run_id) / "log"

        def listed() -> Source:
            record = read_record(log_dir, run_id)
            if record is None:
                from ingest.reader import EventLog

                parts, problem = EventLog(data_dir, run_id).parts(), None
            else:
                parts, problem = located(record)
            if problem is not None:
                raise Moved(problem)  # a part merged away since the record was read: read it again
            stats = tuple((p.path.name, *file_signature(p.path, portable=True)) for p in parts)
            if record is None:
                return cls(run_id, "", 0, "", parts[-1].last if parts else 0, stats)
            return cls(run_id, record.identity, record.entries, record.last_sha, record.tail, stats)

        return while_moving(log_dir, listed, "its parts kept changing while they were listed - try again")

    @property
    def key(self) -> str:
        text = json.dumps([self.run_id, self.identity, self.entries, self.last_sha, self.tail, self.parts])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "identity": self.identity,
            "entries": self.entries,
            "last_sha": self.last_sha,
            "tail": self.tail,
            "parts": [list(p) for p in self.parts],
        }


@dataclass
class State:
    """One stored state: where it lies, what it was derived from, and the files it holds."""

    run_id: str
    dir: Path
    source: Source
    variables: dict[str, Any]  # the flavour's (what a caller asked for)
    values: dict[str, Any]  # every variable set (the flavour's and the views' defaults)
    explicit: set[str]
    tables: dict[str, str]  # materialized table -> its file in tables/

    @property
    def relative(self) -> str:
        """``<run>/<flavour>/<source>``: the same in every root, and what its files' digests are bound to."""
        return f"{self.run_id}/{self.dir.parent.name}/{self.dir.name}"

    def table_files(self) -> dict[str, Path]:
        return {name: self.dir / "tables" / file for name, file in self.tables.items()}


def record_stat(log_dir: Path) -> tuple[int, ...] | None:
    """What changes whenever a run's record is rewritten (a part published, one quarantined): its
    ``file_signature``; None when the log has no record."""
    try:
        return file_signature(log_dir / RECORD)
    except FileNotFoundError:
        return None


def source_from(held: dict[str, Any]) -> Source:
    return Source(
        **{k: held[k] for k in ("run_id", "identity", "entries", "last_sha", "tail")},
        parts=tuple(tuple(p) for p in held["parts"]),
    )
