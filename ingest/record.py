"""A run's record of its parts: the committed list of the files its log is made of.

The log of a run is not whatever files lie in ``log/``: it is the parts its record
names. ``log/_record.jsonl`` is append-only, one entry a line, each naming the parts
it adds and removes (a flush adds one; a merge adds one and removes those it
replaces; ``quarantine`` removes the parts it moves aside), with the run id, its
number, the previous entry's checksum and its own: a chain, so a changed, dropped or
reordered line breaks it, and a record copied from another run names that run. The
live parts (added, not removed) always cover seqs ``1..tail`` without gap or overlap.
An entry is committed once its whole line is fsynced; a line a crash cut short was
never committed (the writer cuts it off when it next opens the run).

Publishing a part: its bytes go to ``log/.tmp-<name>`` (fsynced), the entry naming it
is committed, then the file is renamed to ``<name>``. A committed part still under its
temporary name (the writer between the two steps, or killed there) is read there:
its name's checksum proves the bytes. A file in ``log/`` the record does not name is
not part of the log: nothing reads it, ``verify`` lists it as foreign, and the writer
refuses to append until it is moved aside.

Runs written before records have no record file: their log is the gapless cover of
the part files in ``log/``, widest parts first (:func:`legacy_cover`), where parts
that overlap must hold the same events; the writer adopts such a run (writes its
record) when it next opens it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ingest.errors import LogError, PartDamagedError
from ingest.parts import Part, parse_part
from ingest.paths import TMP_MARK, log_command, write_atomically
from ingest.text import canonical_json

RECORD = "_record.jsonl"
_KEYS = {"entry", "run_id", "prev", "add", "remove", "note", "sha"}
NOTES = (None, "adopted", "quarantined")


class RecordDamagedError(PartDamagedError):
    """The run's record of its parts is damaged: a line changed, dropped or not of this run."""


def _sha_matches(line: bytes, entry: dict) -> bool:
    """Whether a line's checksum is that of its content: over its own bytes when it is canonical
    (``"sha"`` is the last key), else over the canonical form of its entry."""
    tail = f',"sha":"{entry["sha"]}"}}'.encode()
    if line.endswith(tail):
        body = line[: -len(tail)] + b"}"
        if hashlib.sha256(body).hexdigest()[:32] == entry["sha"]:
            return True
    return _sha(entry) == entry["sha"]


def _sha(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != "sha"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()[:32]


@dataclass
class Record:
    """The committed state of a run's record: its live parts and what it removed."""

    run_id: str
    log_dir: Path
    live: dict[str, Part] = field(default_factory=dict)  # name -> part, paths under their names
    removed: dict[str, Part] = field(default_factory=dict)  # merged away: a live part holds their events
    quarantined: set[str] = field(default_factory=set)  # moved aside by quarantine
    entries: int = 0
    last_sha: str = ""
    identity: str = ""  # the first entry's checksum: this run, not another of the same id
    committed: int = 0  # bytes of the file that are committed entries
    torn: bool = False  # a line a crash cut short follows them
    raw: bytes = b""  # the committed entries as read (to parse only what is appended later)
    shas: list[str] = field(default_factory=list)  # each entry's checksum, in order (entry n at n - 1)
    quarantines: list[int] = field(default_factory=list)  # the numbers of the entries that quarantined parts

    def copy(self) -> Record:
        return Record(
            self.run_id,
            self.log_dir,
            dict(self.live),
            dict(self.removed),
            set(self.quarantined),
            self.entries,
            self.last_sha,
            self.identity,
            self.committed,
            self.torn,
            self.raw,
            list(self.shas),
            list(self.quarantines),
        )

    @property
    def path(self) -> Path:
        return self.log_dir / RECORD

    def parts(self) -> list[Part]:
        """The live parts in seq order (paths under their published names)."""
        return sorted(self.live.values(), key=lambda p: p.first)

    @property
    def tail(self) -> int:
        return max((p.last for p in self.live.values()), default=0)

    def known(self) -> set[str]:
        """Every part name the record has committed (live or removed)."""
        return set(self.live) | set(self.removed) | self.quarantined

    def extends(self, entries: int, sha: str) -> bool:
        """Whether this record grew from its state after entry ``entries`` (whose checksum was ``sha``)
        by appending only: that entry is in its chain and no later entry quarantined a part, so
        every event the record held then it holds now, unchanged (merges keep events)."""
        if entries == 0 or entries > self.entries or self.shas[entries - 1] != sha:
            return False
        return all(n <= entries for n in self.quarantines)

    def commit(self, add: list[Part], remove: list[Part], note: str | None = None) -> None:
        """Append one entry and make it durable (the writer's; it holds the run's lock)."""
        entry: dict = {
            "entry": self.entries + 1,
            "run_id": self.run_id,
            "prev": self.last_sha,
            "add": [p.name for p in add],
            "remove": [p.name for p in remove],
        }
        if note is not None:
            entry["note"] = note
        entry["sha"] = _sha(entry)
        line = (canonical_json(entry) + "\n").encode()
        if self.entries == 0:
            _create(self.path, line)
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, "the entry was written in part")
                os.fsync(fd)
            except OSError:  # cut back to the committed entries, or the next line would follow a torn one
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self.committed)
                raise
            finally:
                os.close(fd)
        self._apply(entry, len(line))

    def _apply(self, entry: dict, size: int) -> None:
        for name in entry["remove"]:
            part = self.live.pop(name)
            if entry.get("note") == "quarantined":
                self.quarantined.add(name)
            else:
                self.removed[name] = part
        for name in entry["add"]:
            self.live[name] = parse_part(self.log_dir / name)  # type: ignore[assignment]
            self.removed.pop(name, None)
        self.entries += 1
        if entry.get("note") == "quarantined":
            self.quarantines.append(self.entries)
        self.shas.append(entry["sha"])
        self.last_sha = entry["sha"]
        self.identity = self.identity or entry["sha"]
        self.committed += size


def _create(path: Path, line: bytes) -> None:
    """A new record holding its first entry, published whole (temp file, fsync, rename)."""
    write_atomically(path, line)


def new_record(log_dir: Path, run_id: str) -> Record:
    """The record of a run that has none yet (its first commit creates the file)."""
    return Record(run_id, Path(log_dir))


def read_record(log_dir: Path, run_id: str, known: Record | None = None) -> Record | None:
    """The committed record of a run (None: the run has no record, written before records).

    ``known``: a record read before from the same file; when the file still begins
    with the entries it holds, only the lines appended since are parsed (the record
    is append-only). RecordDamagedError names the first line that is not a
    committed entry of this run.
    """
    path = Path(log_dir) / RECORD
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise LogError(f"{path}: cannot read the run's record of its parts ({err.strerror or err})") from err
    if known is not None and known.committed and data.startswith(known.raw):
        record, start = known.copy(), known.committed
    else:
        record, start = Record(run_id, Path(log_dir)), 0
    *lines, rest = data[start:].split(b"\n")
    for number, line in enumerate(lines, start=record.entries + 1):
        problem = _line_problem(record, line)
        if problem:
            raise RecordDamagedError(
                f"{path}: line {number} is damaged ({problem}) - "
                f"'{log_command(Path(log_dir).parents[2], 'verify', run_id)}' says what is intact"
            )
        record._apply(json.loads(line), len(line) + 1)
    record.raw = data[: record.committed]
    record.torn = bool(rest)
    problem = cover_problem(record.parts())
    if problem:
        raise RecordDamagedError(f"{path}: the parts it names do not form the log ({problem})")
    return record


def _line_problem(record: Record, line: bytes) -> str | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return "not JSON"
    if (
        not isinstance(entry, dict)
        or not {"entry", "run_id", "prev", "add", "remove", "sha"} <= set(entry)
        or set(entry) - _KEYS
        or entry.get("note") not in NOTES
    ):
        return "not an entry of a record"
    if entry["run_id"] != record.run_id:
        return f"an entry of run {entry['run_id']!r}, not of {record.run_id!r}"
    if entry["entry"] != record.entries + 1 or entry["prev"] != record.last_sha:
        return f"entry {entry['entry']} does not follow entry {record.entries}"
    if not isinstance(entry["sha"], str) or not _sha_matches(line, entry):
        return "its checksum does not match its content"
    for name in entry["add"]:
        part = parse_part(Path(name)) if isinstance(name, str) else None
        if part is None or part.digest is None or name in record.live:
            return f"it adds {name!r}, which is not a new checksummed part"
    for name in entry["remove"]:
        if name not in record.live:
            return f"it removes {name!r}, which is not a live part"
    return None


def cover_problem(parts: list[Part]) -> str | None:
    """Why these parts (seq order) do not cover 1..tail exactly once, or None."""
    expected = 1
    for part in parts:
        if part.first != expected:
            return f"{part.name} starts at seq {part.first}, the parts before it end at {expected - 1}"
        expected = part.last + 1
    return None


def locate(log_dir: Path, name: str) -> Path | None:
    """Where a committed part is: under its name, or still under its temporary one (None: neither).

    The temporary name is looked at first: a part only ever moves from it to its name, so one
    renamed between the two looks is found under its name (looked at the other way round, it
    would be at neither)."""
    for candidate in (log_dir / (TMP_MARK + name), log_dir / name):
        if candidate.exists():
            return candidate
    return None


# ------------------------------------------------------------ runs before records


def list_parts(log_dir: Path) -> list[Part]:
    """The part files in ``log_dir`` (by name), widest first at each seq."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    parts = [p for p in (parse_part(Path(log_dir) / n) for n in names) if p is not None]
    return sorted(parts, key=lambda p: (p.first, -p.last, p.path.name))


def legacy_cover(parts: list[Part]) -> tuple[list[Part], str | None]:
    """Parts covering 1..tail without overlap, widest first; or a problem description."""
    chosen: list[Part] = []
    expected = 1
    by_first: dict[int, Part] = {}
    for p in parts:
        if p.first not in by_first or p.last > by_first[p.first].last:
            by_first[p.first] = p
    max_last = max((p.last for p in parts), default=0)
    while expected <= max_last:
        part = by_first.get(expected)
        if part is None:
            straddling = [p for p in parts if p.first < expected <= p.last]
            if straddling:
                return chosen, f"{straddling[0].path.name} overlaps the parts before it"
            resume = min(p.first for p in parts if p.first > expected)
            missing = f"seq {expected} is" if resume == expected + 1 else f"seqs {expected}-{resume - 1} are"
            return chosen, f"{missing} missing: no part holds them (the log goes on to seq {max_last})"
        chosen.append(part)
        expected = part.last + 1
    return chosen, None
