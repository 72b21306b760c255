"""The integrity of a run's log: check every byte of every part (``verify``), move damage aside (``quarantine``).

Readers check each part they use against the checksum its name records and its
footer (``ingest.checks``). ``verify`` goes further, over the whole log: the record
of parts (its chain of entries), every live part's checksum, footer, every page of
every row group decoded, its seqs exactly the range its name gives and every event
of this run, the parts forming a gapless ``1..tail``, and no file in ``log/`` that
the record does not name. It reports each part with its problem and the intact
prefix: the seqs before the first problem.

Nothing is appended after a problem (the writer refuses) until ``quarantine`` moves
it aside, never deleting anything: a foreign file alone; a damaged part with every
part after it (events after a damaged one cannot stay in a gapless log, and the
intact prefix is a state the run really had, since each part is one whole step of
the engine), the record then committing that they left; a damaged record, which
leaves the run to be read, and adopted, as a run written before records is. The
spool of finished turns goes with damaged parts (its turns followed the old tail).
An exploration then continues from the prefix with ``explore --resume``, which runs
again the turns the moved events recorded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.checks import content_problem
from ingest.errors import InputError
from ingest.listing import while_moving
from ingest.parts import Part
from ingest.paths import TMP_MARK, fsync_dir, log_command
from ingest.reader import EventLog
from ingest.record import (
    RECORD,
    Record,
    RecordDamagedError,
    legacy_cover,
    list_parts,
    locate,
)
from ingest.steps import uninterruptible
from ingest.writer import WriterLock, foreign_files

QUARANTINE_DIR = "quarantine"
MISSING = "named by the run's record, but missing"


@dataclass(frozen=True)
class PartCheck:
    """One part of the log and what ``verify`` found wrong with it (``problem`` None: intact)."""

    name: str
    path: Path
    first: int
    last: int
    level: int
    checksum: bool  # whether its name records a checksum (parts written before checksums do not)
    problem: str | None = None

    @property
    def seqs(self) -> str:
        return f"seqs {self.first}..{self.last}"


@dataclass
class Verification:
    """What ``verify`` found: every part in seq order, the intact prefix, the first problem."""

    run_id: str
    log_dir: Path
    parts: list[PartCheck]
    intact_to: int  # the last seq of the intact prefix (0: nothing intact)
    tail: int  # the last seq any part names
    problem: str | None = None  # the first problem, in words (None: the log verifies)
    first_bad: PartCheck | None = None  # the first part at or after that problem
    recorded: bool = True  # whether the run has a record of its parts (runs before records have none)
    # What a crash left, which the writer removes when it opens the run: parts a merge
    # superseded (their events are in a live part) and unpublished temp files.
    superseded: list[PartCheck] = field(default_factory=list)
    temporary: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # files in log/ that are not the run's

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def unchecksummed(self) -> int:
        return sum(not p.checksum for p in self.parts)


def _check(part: Part, source: BinaryIO | None = None) -> PartCheck:
    try:
        data = part.path.read_bytes() if source is None else source.read()
    except FileNotFoundError:
        raise
    except OSError as err:
        return _part_check(part, f"unreadable ({err.strerror or err})")
    return _part_check(part, content_problem(part, data))


def verify_log(log: EventLog) -> Verification:
    """Check every byte of every part of ``log`` (see the module docstring).

    A part that compaction removes while it is checked makes the whole check start
    again from a new listing (the log it describes stays the same events).
    """
    log.require()

    def verify() -> Verification:
        try:
            record = log.record()
        except RecordDamagedError as err:
            return _damaged_record(log, err)
        return _verify_legacy(log) if record is None else _verify(log, record)

    return while_moving(log.log_dir, verify, "parts kept disappearing while verifying - try again")


def _verify(log: EventLog, record: Record) -> Verification:
    # Every live part is opened right after the record is read: an open file stays readable
    # when a merge removes it meanwhile, so the check sees the log the record named.
    handles: list[tuple[Part, BinaryIO | None]] = []
    try:
        for part in record.parts():
            path = locate(record.log_dir, part.name)
            if path is None:
                newer = log.record()
                if newer is not None and newer.entries != record.entries:
                    raise FileNotFoundError(part.name)  # a merge removed it meanwhile: check the new record
                handles.append((part, None))
                continue
            located = Part(part.first, part.last, part.level, path, part.digest)
            handles.append((located, open(path, "rb")))  # noqa: SIM115 - closed below
        checks = [_part_check(p, MISSING) if fh is None else _check(p, fh) for p, fh in handles]
    finally:
        for _p, fh in handles:
            if fh is not None:
                fh.close()
    names = set(os.listdir(log.log_dir))
    foreign = foreign_files(record)
    if foreign:  # or published since the record was read (a writer is at work): not foreign then
        newer = log.record()
        known = newer.known() if newer is not None else set()
        foreign = [n for n in foreign if n not in known]
    superseded = [_part_check(record.removed[n], "superseded") for n in sorted(names & set(record.removed))]
    temporary = sorted(n for n in names if n.startswith(TMP_MARK) and n[len(TMP_MARK) :] not in record.live)
    result = Verification(
        log.run_id,
        log.log_dir,
        checks,
        intact_to=record.tail,
        tail=record.tail,
        superseded=superseded,
        temporary=temporary,
        foreign=foreign,
    )
    _first_problem(result, checks)
    return result


def _first_problem(result: Verification, checks: list[PartCheck]) -> None:
    bad = next((c for c in checks if c.problem), None)
    if bad is not None:
        result.intact_to, result.first_bad = bad.first - 1, bad
        result.problem = f"{bad.name} ({bad.seqs}) is damaged: {bad.problem}"
    elif result.foreign:
        more = len(result.foreign) - 3
        shown = ", ".join(result.foreign[:3]) + (f" (+{more} more)" if more > 0 else "")
        result.problem = (
            f"{len(result.foreign)} file(s) in {result.log_dir} are not parts the run's record names "
            f"(copied in?): {shown} - nothing reads them"
        )


def _damaged_record(log: EventLog, err: RecordDamagedError) -> Verification:
    listed = list_parts(log.log_dir)
    checks = [_part_check(p, None) for p in listed]
    result = Verification(log.run_id, log.log_dir, checks, intact_to=0, tail=max((p.last for p in listed), default=0))
    result.problem = f"{err} - the run's parts cannot be told from files copied in"
    result.first_bad = PartCheck(RECORD, log.log_dir / RECORD, 0, 0, 0, True, str(err))
    return result


def _verify_legacy(log: EventLog) -> Verification:
    listed = list_parts(log.log_dir)
    chosen, gap = legacy_cover(listed)
    end = chosen[-1].last if chosen else 0
    # Parts past the gapless cover (after a gap, or overlapping it), and parts a merge
    # superseded (a crash between publishing a merge and removing what it replaced).
    after = [p for p in listed if p not in chosen and p.last > end]
    superseded = [p for p in listed if p not in chosen and p.last <= end]
    checks = [_check(p) for p in chosen + after]
    part_names = {p.path.name for p in listed}
    result = Verification(
        log.run_id,
        log.log_dir,
        checks,
        intact_to=end,
        tail=max((p.last for p in listed), default=0),
        recorded=False,
        superseded=[_part_check(p, "superseded") for p in superseded],
        temporary=sorted(n for n in os.listdir(log.log_dir) if n.startswith(TMP_MARK)),
        foreign=sorted(n for n in os.listdir(log.log_dir) if n not in part_names and not n.startswith(TMP_MARK)),
    )
    _first_problem(result, checks[: len(chosen)])
    if result.ok and gap is not None:
        result.first_bad = checks[len(chosen)] if after else None
        result.problem = gap
    if result.ok:
        _, overlap = log.legacy_parts()
        if overlap is not None:
            result.problem = overlap
            result.first_bad = next((c for c in result.superseded if c.name in overlap), None)
    return result


def _part_check(part: Part, problem: str | None) -> PartCheck:
    return PartCheck(part.name, part.path, part.first, part.last, part.level, part.digest is not None, problem)


@dataclass
class Quarantined:
    """What ``quarantine`` moved aside, and the log that is left."""

    run_id: str
    moved: list[PartCheck]  # the first bad part, then every part after it (or the one foreign file)
    destination: Path
    intact_to: int  # the log now holds seqs 1..intact_to
    events_moved: int  # seqs intact_to+1 .. the old tail
    turns_moved: int | None  # TurnFinished events among them (None: a moved part is unreadable)
    finished_moved: bool  # the run's RunFinished was among them
    spool_moved: Path | None  # where the spool of finished turns went, if there was one
    foreign: bool = False  # a file that was not part of the log (nothing of the log moved)


def quarantine(log: EventLog, part: str) -> Quarantined:
    """Move a foreign file, or the first bad part of ``log`` and every part after it, aside (never deleting).

    ``part`` names that file or part (its name or path); any other is refused, so
    nothing intact is moved by a typo. Holds the writer's lock while it moves, so
    a run being written is refused.
    """
    lock = WriterLock(log.require())
    lock.acquire()
    try:
        found = verify_log(log)
        destination = log.dir / QUARANTINE_DIR
        name = Path(part).name
        if name in found.foreign or (name == RECORD and found.first_bad and found.first_bad.name == RECORD):
            return _move_one(log, found, name, destination)
        target = _target(found, part)
        moving = [target] + [p for p in found.parts + found.superseded if p.first > found.intact_to and p != target]
        moving.sort(key=lambda c: (c.first, -c.last, c.name))
        turns, finished = _turns_in(moving)
        destination.mkdir(exist_ok=True)
        with uninterruptible():  # the record's entry and the moves it says: not cut apart by a signal
            if found.recorded:
                record = log.record()
                assert record is not None
                record.commit([], [record.live[p.name] for p in moving if p.name in record.live], note="quarantined")
            for p in reversed(moving):  # the newest first: what is left is always a prefix and the rest
                if p.problem != MISSING:
                    os.rename(p.path, _free_name(destination, p.name))
            spool = log.dir / "spool"
            spool_moved = None
            if spool.is_dir():
                spool_moved = _free_name(destination, "spool")
                os.rename(spool, spool_moved)
            fsync_dir(destination)
            fsync_dir(log.log_dir)
    finally:
        lock.release()
    return Quarantined(
        log.run_id, moving, destination, found.intact_to, found.tail - found.intact_to, turns, finished, spool_moved
    )


def _move_one(log: EventLog, found: Verification, name: str, destination: Path) -> Quarantined:
    """Move one file that is not part of the log (or the damaged record) aside; the log's parts stay."""
    destination.mkdir(exist_ok=True)
    source = log.log_dir / name
    os.rename(source, _free_name(destination, name))
    fsync_dir(destination)
    fsync_dir(log.log_dir)
    moved = PartCheck(name, source, 0, 0, 0, False, "not a part of the log" if name != RECORD else found.problem)
    return Quarantined(log.run_id, [moved], destination, found.intact_to, 0, 0, False, None, foreign=True)


def _target(found: Verification, part: str) -> PartCheck:
    """The part ``quarantine`` may move first: the first bad one, named as the user named it."""
    name = Path(part).name
    if found.ok:
        raise InputError(f"run {found.run_id!r}: the log verifies - nothing to quarantine")
    bad = found.first_bad
    if bad is None:  # the log just ends early: nothing after the problem to move
        if found.foreign:
            raise InputError(
                f"{found.log_dir}: {name!r} is not among the files to move aside - "
                f"'{log_command(found.log_dir.parents[2], 'verify', found.run_id)}' lists them: "
                f"{', '.join(found.foreign)}"
            )
        raise InputError(f"run {found.run_id!r}: {found.problem}, and no part follows it - nothing to move")
    if name == bad.name:
        return bad
    named = next((p for p in found.parts + found.superseded if p.name == name), None)
    if named is None:
        verify = log_command(found.log_dir.parents[2], "verify", found.run_id)
        raise InputError(f"{found.log_dir}: no part named {name!r} - '{verify}' lists them")
    where = "intact" if named.last <= found.intact_to and not named.problem else "after the first bad part"
    msg = (
        f"{name} is {where}; quarantine starts at the first bad part, {bad.name} ({bad.seqs}), "
        "and moves every part after it too - nothing was moved"
    )
    raise InputError(msg)


def _turns_in(parts: list[PartCheck]) -> tuple[int | None, bool]:
    """TurnFinished events among these parts (None if one cannot be read), and whether RunFinished is."""
    turns, finished = 0, False
    for p in parts:
        if p.problem == "superseded":
            continue
        try:
            kinds = pq.read_table(p.path, columns=["kind"]).column("kind")
        except (pa.ArrowInvalid, OSError):
            return None, finished
        turns += pc.sum(pc.equal(kinds, "turn_finished")).as_py() or 0
        finished = finished or pc.any(pc.equal(kinds, "run_finished")).as_py()
    return turns, bool(finished)


def _free_name(directory: Path, name: str) -> Path:
    """``directory/name``, or ``name.1``, ``name.2``... if taken (an earlier quarantine's)."""
    path, n = directory / name, 0
    while path.exists():
        n += 1
        path = directory / f"{name}.{n}"
    return path
