"""Writing a run's log: one writer per run (a lock), parts published and recorded, compaction.

A part is published in three durable steps: its bytes to ``log/.tmp-<name>``
(fsynced), the record's entry naming it (fsynced: the commit), the rename to
``<name>`` (the directory fsynced). A signal cannot cut them apart
(``ingest.steps``); a kill -9 can, and the writer finishes the step when it next
opens the run (a committed part under its temporary name is renamed; an uncommitted
write is removed). Compaction merges the newest ``FANOUT`` parts of one level into
one part of the next (a base-FANOUT counter, so the files grow only
logarithmically): the merged part's bytes are decoded and compared with the events
of the parts it replaces before the entry that swaps them is committed, and only
then are the replaced files removed. No code path removes a file whose events the
record does not show held by a live part.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.checks import check_part, content_problem, damaged_part
from ingest.encoding import canonical, encode_part, narrow
from ingest.errors import LogError, PartDamagedError, SeqConflictError, WriterLockedError
from ingest.events import Event
from ingest.faults import crash_point
from ingest.names import CAMPAIGN, RUN, claim
from ingest.parts import Part, content_digest, part_name
from ingest.paths import TMP_MARK, fsync_dir, log_command
from ingest.reader import EventLog, read_whole, same_events
from ingest.record import (
    RECORD,
    Record,
    RecordDamagedError,
    list_parts,
    locate,
    new_record,
    read_record,
)
from ingest.schema import SCHEMA, to_arrow
from ingest.steps import uninterruptible

FANOUT = 8
CACHED_LEVELS = 3  # the writer keeps its small parts in memory for merging


class WriterLock:
    """The exclusive right to change one run's log: ``flock`` on ``writer.lock``, the holder's pid inside.

    The lock dies with its process (``kill -9`` included), so a crash never leaves
    a run locked.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise WriterLockedError naming the process that holds it."""
        fd = os.open(self.log.dir / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                msg = (
                    f"run {self.log.run_id!r} is being written by another process "
                    f"(pid {holder}); wait for it to finish or stop it first"
                )
                raise WriterLockedError(msg) from err
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def foreign_files(record: Record) -> list[str]:
    """The files of ``log/`` that are not the run's: neither the record, a part it names, nor a write in progress."""
    out = []
    for name in sorted(os.listdir(record.log_dir)):
        if name == RECORD or name in record.live or name in record.removed or name.startswith(TMP_MARK):
            continue
        out.append(name)
    return out


class LogWriter:
    """The single appender of one run (holds an exclusive lock until closed)."""

    def __init__(self, log: EventLog, fanout: int = FANOUT) -> None:
        self.log = log
        self.fanout = fanout
        self._lock = WriterLock(log)
        self._record: Record = new_record(log.log_dir, log.run_id)
        self._parts: list[Part] = []
        self._pending: list[pa.Table] = []
        self._cache: dict[str, pa.Table] = {}

    # -- opening and closing

    @classmethod
    def create(cls, data_dir: Path | str, run_id: str, kind: str = RUN) -> LogWriter:
        """Open a new, empty run for appending; refuse a run that has events, or whose name clashes with another
        run's or a campaign's (:mod:`ingest.names`). ``kind`` campaign: a campaign's log, ``data_dir`` the
        data directory's ``campaigns``."""
        log = EventLog(data_dir, run_id)
        claim(Path(data_dir).parent if kind == CAMPAIGN else data_dir, [(kind, run_id)])
        log.log_dir.mkdir(parents=True, exist_ok=True)
        writer = cls(log)
        writer._acquire()
        if writer.tail > 0:
            writer.close()
            msg = f"run {run_id!r} already exists in {log.dir} - choose another --run-id"
            raise LogError(msg)
        return writer

    @classmethod
    def open(cls, data_dir: Path | str, run_id: str) -> LogWriter:
        """Open an existing run for appending, once every part checks (see :meth:`_recover`)."""
        writer = cls(EventLog(data_dir, run_id).require())
        writer._acquire()
        return writer

    @property
    def identity(self) -> str:
        """The checksum of the record's first entry: this run, not another that had its id."""
        return self._record.identity

    def _acquire(self) -> None:
        self._lock.acquire()
        try:
            self._recover()
        except BaseException:
            self._lock.release()
            raise

    def _recover(self) -> None:
        """Finish or undo what a crash left, and refuse a log that does not check.

        With a record: a line a crash cut short is cut off, a committed part still under
        its temporary name is renamed, an uncommitted write is removed, and a part a
        committed merge replaced is removed once its bytes are those its name records.
        A file the record does not name (copied in) stops everything: nothing is
        appended until ``quarantine`` moved it aside. Without a record (a run written
        before records) the run is adopted. Every live part is then checked as a reader
        checks it (checksum, footer, run id): nothing is appended after a damaged part.
        """
        try:
            record = read_record(self.log.log_dir, self.log.run_id)
        except RecordDamagedError as err:
            raise RecordDamagedError(f"run {self.log.run_id!r} does not verify, nothing was appended: {err}") from err
        if record is None:
            record = self._adopt()
        else:
            self._tidy(record)
        parts = []
        for part in record.parts():
            path = locate(record.log_dir, part.name)
            if path is None:
                err = damaged_part(part, "named by the run's record, but missing")
                raise PartDamagedError(f"run {self.log.run_id!r} does not verify, nothing was appended: {err}")
            parts.append(Part(part.first, part.last, part.level, path, part.digest))
        try:
            for part in parts:
                check_part(part)
        except PartDamagedError as err:
            raise PartDamagedError(f"run {self.log.run_id!r} does not verify, nothing was appended: {err}") from err
        self._record, self._parts = record, parts

    def _tidy(self, record: Record) -> None:
        log_dir = record.log_dir
        if record.torn:
            with open(record.path, "r+b") as fh:
                fh.truncate(record.committed)
                os.fsync(fh.fileno())
        foreign = foreign_files(record)
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            msg = (
                f"{log_dir / foreign[0]}{more}: not a part the run's record names (a file copied in?) - "
                f"nothing was appended; '{log_command(self.log.data_dir, 'verify', self.log.run_id)}' lists such "
                f"files, '{log_command(self.log.data_dir, 'quarantine', self.log.run_id, foreign[0])}' moves one aside"
            )
            raise LogError(msg)
        for name in sorted(os.listdir(log_dir)):
            path = log_dir / name
            if name.startswith(TMP_MARK):
                target = name[len(TMP_MARK) :]
                if target in record.live and not (log_dir / target).exists():
                    os.rename(path, log_dir / target)  # committed, not yet renamed: finish it
                else:
                    path.unlink()  # a write that was never committed
            elif name in record.removed and _holds(path, record.removed[name]):
                path.unlink()  # merged away: a live part holds its events
        fsync_dir(log_dir)

    def _adopt(self) -> Record:
        """Give a run written before records its record: the cover of its part files, checked.

        Parts that overlap the cover must hold the same events (else one of them is not
        this run's and nothing is adopted); parts named without a checksum get one once
        every page decodes and every event is this run's.
        """
        log_dir = self.log.log_dir
        for name in os.listdir(log_dir):
            if name.startswith(TMP_MARK):
                (log_dir / name).unlink(missing_ok=True)
        chosen, problem = self.log.legacy_parts()
        if problem is not None:
            msg = (
                f"{log_dir}: {problem} - the log is inconsistent; nothing was appended "
                f"('{log_command(self.log.data_dir, 'verify', self.log.run_id)}' says what is intact)"
            )
            raise LogError(msg)
        listed = list_parts(log_dir)
        others = [n for n in sorted(os.listdir(log_dir)) if n not in {p.path.name for p in listed}]
        if others:
            msg = (
                f"{log_dir / others[0]}: not a part of the log - nothing was appended; "
                f"'{log_command(self.log.data_dir, 'quarantine', self.log.run_id, others[0])}' moves it aside"
            )
            raise LogError(msg)
        adopted = [self._checksummed(p) for p in chosen]
        for part in listed:  # superseded by a merge: the cover holds the same events
            if part not in chosen:
                part.path.unlink()
        record = new_record(log_dir, self.log.run_id)
        if adopted:
            record.commit(adopted, [], note="adopted")
        return record

    @staticmethod
    def _checksummed(part: Part) -> Part:
        """A part of a run written before records, named with its checksum once its content is whole."""
        data = part.path.read_bytes()
        problem = content_problem(part, data)
        if problem is not None:
            raise damaged_part(part, problem)
        if part.digest is not None:
            return part
        digest = content_digest(data)
        adopted = Part(
            part.first,
            part.last,
            part.level,
            part.path.with_name(part_name(part.first, part.last, part.level, digest)),
            digest,
        )
        os.rename(part.path, adopted.path)
        fsync_dir(part.path.parent)
        return adopted

    def close(self) -> None:
        """Flush staged events and release the writer lock."""
        if self._lock.held:
            try:
                self.flush()
            finally:
                self._lock.release()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not publish what an error interrupted
            self._pending = []
            self._lock.release()

    # -- appending

    @property
    def tail(self) -> int:
        """The seq of the last event staged or published."""
        return self._published_tail() + sum(t.num_rows for t in self._pending)

    def _published_tail(self) -> int:
        return self._parts[-1].last if self._parts else 0

    def stage(self, events: list[Event]) -> pa.Table:
        """Number ``events`` after the tail and keep them for the next :meth:`flush`.

        Staged events are invisible to readers and lost if the process dies before
        the flush; the log stays a gapless prefix either way. Returns their rows.
        """
        if not self._lock.held:
            raise LogError(f"run {self.log.run_id!r}: the writer is closed")
        if not events:
            return SCHEMA.empty_table()
        table = to_arrow(list(events), self.log.run_id, self.tail + 1, datetime.now(UTC))
        self._pending.append(table)
        return table

    def mark(self) -> int:
        """A point among the staged events that :meth:`unstage` can go back to."""
        return len(self._pending)

    def unstage(self, mark: int) -> None:
        """Drop what was staged after ``mark`` (a step that did not complete)."""
        del self._pending[mark:]

    def flush(self) -> None:
        """Publish every staged event as one part file (atomic), then compact."""
        if not self._pending:
            return
        table = (
            pa.concat_tables(self._pending, promote_options="default") if len(self._pending) > 1 else self._pending[0]
        )
        first = self._published_tail() + 1
        self._publish(canonical(narrow(table)), first, first + table.num_rows - 1, 0)
        self._compact()

    def append(self, events: list[Event], expected_seq: int | None = None) -> pa.Table:
        """Stage and flush ``events``; return the stored rows (with their seqs).

        Raises SeqConflictError when ``expected_seq`` is given and is not the tail.
        """
        if expected_seq is not None and expected_seq != self.tail:
            msg = f"run {self.log.run_id!r}: expected tail seq {expected_seq}, log is at {self.tail}"
            raise SeqConflictError(msg)
        table = self.stage(events)
        self.flush()
        return table

    def _publish(self, table: pa.Table, first: int, last: int, level: int, replaces: list[Part] = ()) -> Part:
        """Write, record and rename one part (see the module docstring); ``replaces``: the parts it merges."""
        log_dir = self.log.log_dir
        final = log_dir / f"part-{first:012d}-{last:012d}-L{level}.parquet"  # named in errors
        tmp = None
        with uninterruptible():
            try:
                data, digest = encode_part(table, level)
                final = final.with_name(part_name(first, last, level, digest))
                if replaces and not same_events(pq.read_table(pa.BufferReader(data)), table):
                    raise LogError(
                        f"{final}: the merged part does not decode to the events it replaces - nothing was merged"
                    )
                tmp = log_dir / (TMP_MARK + final.name)
                with open(tmp, "wb") as fh:
                    fh.write(memoryview(data))
                    fh.flush()
                    os.fsync(fh.fileno())
                crash_point("publish.written")
                part = Part(first, last, level, final, digest)
                self._record.commit([part], list(replaces))
            except OSError as err:  # a full disk, a quota: what is published stays intact
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
                tail = self._published_tail()
                kept = f"the log is intact up to seq {tail}" if tail else "nothing of the run was published"
                msg = f"{final}: cannot write this part of the log ({err.strerror or err}); {kept}"
                raise LogError(msg) from err
            # Committed: the part is in the log, under its temporary name until renamed.
            if replaces:
                self._parts[-len(replaces) :] = [part]
            else:
                self._parts.append(part)
                self._pending = []
            crash_point("publish.recorded")
            with contextlib.suppress(OSError):  # a reader finds it under its temporary name meanwhile
                os.rename(tmp, final)
                crash_point("publish.renamed")
                fsync_dir(log_dir)
        if level < CACHED_LEVELS:
            self._cache[final.name] = table
        return part

    def _compact(self) -> None:
        """Merge the newest FANOUT parts while they share one level.

        The parts it merges come from the writer's cache, or from disk checked as
        every reader checks them; they are removed once the merge is committed.
        """
        while len(self._parts) >= self.fanout:
            tail = self._parts[-self.fanout :]
            level = tail[0].level
            if any(p.level != level for p in tail):
                return
            tables = [self._cache.pop(p.name, None) for p in tail]
            tables = [t if t is not None else read_whole(p) for t, p in zip(tables, tail, strict=True)]
            merged = canonical(pa.concat_tables(tables, promote_options="default"))
            self._publish(merged, tail[0].first, tail[-1].last, level + 1, replaces=tail)
            crash_point("compact.published")
            with uninterruptible():
                for i, old in enumerate(tail):
                    old.path.unlink(missing_ok=True)
                    if i == 0:
                        crash_point("compact.removing")
                fsync_dir(self.log.log_dir)

    def file_count(self) -> int:
        """Number of published part files."""
        return len(self._parts)


def _holds(path: Path, part: Part) -> bool:
    """Whether the file at ``path`` is exactly the part its name records (its checksum matches)."""
    try:
        with open(path, "rb") as fh:
            return part.digest is not None and content_digest(fh) == part.digest
    except OSError:
        return False
