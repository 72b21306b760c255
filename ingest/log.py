"""Append-only Parquet event log: one directory per run, immutable part files.

Layout of a run::

    <data>/runs/<run_id>/
        writer.lock                      held (flock) by the one process that appends
        log/part-<first>-<last>-L<k>-<sha>.parquet   published parts, never modified
        log/.tmp-*                        unpublished writes (ignored, cleaned up)
        spool/                            finished turns not yet appended (engine)
        quarantine/                       parts moved aside by ``quarantine`` (integrity)

A part is published by writing a temp file, fsyncing it, renaming it into place
and fsyncing the directory, so a reader never sees a partial file. Its name
records the seqs it holds and a checksum of its bytes (``<sha>``: the first 128
bits of their SHA-256), which every reader checks before using the part: a
damaged page, a changed value or a truncated file cannot also change the name
that was published with it. A part named without a checksum was written before
checksums existed; readers check only its footer, and the writer gives it one
once every page decodes. A merged part
writes the rows of each kind holding at least 1/``GROUP_SHARE`` of them as a row
group of their own, the other rows as one more (seq order within each): a load of
one kind then skips the row groups whose ``kind`` statistics exclude it. Sequence
numbers are assigned here, per run, without gaps. Compaction merges the newest
``FANOUT`` parts of one level into one part of the next level (a base-FANOUT
counter), so the number of files grows only logarithmically; the merged part is
published before the parts it replaces are removed, and readers pick a cover of
``1..tail`` that prefers the widest parts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.errors import (
    InputError,
    LogError,
    PartDamagedError,
    SeqConflictError,
    WriterLockedError,
)
from ingest.events import ENVELOPE, SCHEMA, Event, as_utf8, to_arrow
from ingest.faults import crash_point

FANOUT = 8
# A kind with at least 1/GROUP_SHARE of a merged part's rows gets a row group of its own
# (the tool calls, ~85% of a run's events): the catalog's scans of the other kinds skip
# it. A flushed part, small, stays one row group. Measured: docs/DECISIONS.md.
GROUP_SHARE = 8
CACHED_LEVELS = 3  # the writer keeps its small parts in memory for merging
DIGEST_CHARS = 32  # hex digits of a part's SHA-256 its name records (128 bits)
PART_RE = re.compile(rf"^part-(\d{{12}})-(\d{{12}})-L(\d+)(?:-([0-9a-f]{{{DIGEST_CHARS}}}))?\.parquet$")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DATA_ENV = "TEACHER_MCTS_DATA"


@dataclass(frozen=True, order=True)
class Part:
    """One published part file covering seqs ``first..last``."""

    first: int
    last: int
    level: int
    path: Path
    digest: str | None = None  # the checksum its name records (None: written before checksums)

    @property
    def rows(self) -> int:
        return self.last - self.first + 1

    @property
    def seqs(self) -> str:
        return f"seqs {self.first}..{self.last}"


def part_name(first: int, last: int, level: int, digest: str) -> str:
    """The file name of a published part."""
    return f"part-{first:012d}-{last:012d}-L{level}-{digest}.parquet"


def content_digest(data: bytes | memoryview | BinaryIO) -> str:
    """The checksum a part's name records: SHA-256 of its bytes (or an open file's), shortened."""
    full = hashlib.sha256(data) if isinstance(data, bytes | memoryview) else hashlib.file_digest(data, "sha256")
    return full.hexdigest()[:DIGEST_CHARS]


def default_data_dir() -> Path:
    """The data directory: ``$TEACHER_MCTS_DATA`` or ``./data``."""
    return Path(os.environ.get(DATA_ENV) or "data")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is usable as a directory name, else raise InputError."""
    if not RUN_ID_RE.match(run_id or "") or ".." in run_id:
        msg = f"invalid run id {run_id!r}: use letters, digits, '_', '-' and '.' (max 128)"
        raise InputError(msg)
    return run_id


def run_dir(data_dir: Path, run_id: str) -> Path:
    """The directory of one run."""
    return Path(data_dir) / "runs" / check_run_id(run_id)


def run_ids(data_dir: Path | str) -> list[str]:
    """The runs under ``<data>/runs`` that have a published event, by id."""
    try:
        names = sorted(os.listdir(Path(data_dir) / "runs"))
    except FileNotFoundError:
        return []
    return [n for n in names if RUN_ID_RE.match(n) and _list_parts(Path(data_dir) / "runs" / n / "log")]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list_parts(log_dir: Path) -> list[Part]:
    parts = []
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    for name in names:
        m = PART_RE.match(name)
        if m:
            parts.append(Part(int(m[1]), int(m[2]), int(m[3]), log_dir / name, m[4]))
    return sorted(parts, key=lambda p: (p.first, -p.last, p.path.name))


def _cover(parts: list[Part]) -> tuple[list[Part], str | None]:
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


class EventLog:
    """Read access to one run's log; safe while another process appends."""

    def __init__(self, data_dir: Path | str, run_id: str) -> None:
        self.data_dir = Path(data_dir)
        self.run_id = check_run_id(run_id)
        self.dir = run_dir(self.data_dir, run_id)
        self.log_dir = self.dir / "log"
        if as_utf8(str(self.data_dir)) != str(self.data_dir):  # DuckDB reads parts by path
            msg = f"{as_utf8(str(self.data_dir))}: the data directory's path is not UTF-8 - use another --data"
            raise LogError(msg)

    def exists(self) -> bool:
        """Whether the run has at least one published event."""
        return bool(_list_parts(self.log_dir))

    def require(self) -> EventLog:
        """Return self, or raise LogError naming the missing run."""
        if not self.exists():
            msg = f"run {self.run_id!r} not found under {self.data_dir / 'runs'}"
            raise LogError(msg)
        return self

    def parts(self, attempts: int = 20) -> list[Part]:
        """The published parts forming a consistent prefix ``1..tail``.

        A listing taken while the writer compacts can miss a part that is being
        replaced; such a listing shows a gap and is simply taken again.
        """
        problem = None
        for i in range(attempts):
            chosen, problem = _cover(_list_parts(self.log_dir))
            if problem is None:
                return chosen
            time.sleep(0.005 * (i + 1))
        msg = f"{self.log_dir}: {problem} - the log is inconsistent"
        raise LogError(msg)

    def tail_seq(self) -> int:
        """The seq of the last published event (0 for an empty log)."""
        parts = self.parts()
        return parts[-1].last if parts else 0

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        """All published events as one Arrow table in seq order.

        Each part is read whole once, checked against its checksum and footer
        (:func:`check_part`), and parsed from those bytes.
        """
        parts, handles = self._open_parts()
        try:
            tables = [_read_part(fh, columns, part) for fh, part in zip(handles, parts, strict=True)]
        finally:
            for fh in handles:
                fh.close()
        if not tables:
            schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables, promote_options="default")

    def scan_kind(self, kind: str, columns: list[str], upto: int | None = None,
                  batch_rows: int = 1024) -> Iterator[pa.Table]:  # fmt: skip
        """The events of one kind in seq order, a batch at a time, only ``columns`` decoded.

        Only the row groups whose ``kind`` statistics admit the kind are read, and no
        more than ``batch_rows`` rows are decoded at once, so bulky columns of a large
        run are never all in memory. ``upto``: the last seq wanted (a reader's prefix).
        """
        parts, handles = self._open_parts()
        try:
            for fh, part in zip(handles, parts, strict=True):
                if upto is not None and part.first > upto:
                    break
                yield from _scan_part(fh, part, kind, columns, upto, batch_rows)
        finally:
            for fh in handles:
                fh.close()

    def _open_parts(self) -> tuple[list[Part], list[BinaryIO]]:
        """The parts of the published prefix, each opened right after listing.

        An open file stays readable even if compaction removes it meanwhile, so only
        the (short) opening can race; a part gone by then means listing again.
        """
        for attempt in range(50):
            parts = self.parts()
            handles: list[BinaryIO] = []
            try:
                for part in parts:
                    handles.append(open(part.path, "rb"))  # noqa: SIM115 - the caller closes them
            except FileNotFoundError:
                for fh in handles:
                    fh.close()
                time.sleep(0.002 * attempt)
                continue
            return parts, handles
        raise LogError(f"{self.log_dir}: parts kept disappearing while reading - try again")


def _scan_part(source: BinaryIO, part: Part, kind: str, columns: list[str], upto: int | None,
               batch_rows: int) -> Iterator[pa.Table]:  # fmt: skip
    """One part's rows of ``kind`` (seq <= ``upto``) with ``columns``, batch by batch."""
    try:
        present = set(check_part(part, source).names)
        file = pq.ParquetFile(source)
        kind_at = next(i for i in range(file.metadata.num_columns) if file.metadata.schema.column(i).path == "kind")
        groups = [g for g in range(file.num_row_groups) if _may_hold(file.metadata.row_group(g), kind_at, kind)]
        wanted = [c for c in dict.fromkeys([*columns, "kind", "seq"]) if c in present]
        for batch in file.iter_batches(batch_size=batch_rows, row_groups=groups, columns=wanted):
            table = pa.Table.from_batches([batch])
            keep = pc.equal(table.column("kind"), kind)
            if upto is not None:
                keep = pc.and_(keep, pc.less_equal(table.column("seq"), upto))
            table = table.filter(keep)
            if table.num_rows:
                yield pa.Table.from_arrays(
                    [table.column(c) if c in table.column_names else pa.nulls(table.num_rows, SCHEMA.field(c).type)
                     for c in columns], names=columns,
                )  # fmt: skip
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable_part(part.path, err) from err


def _may_hold(group: pq.RowGroupMetaData, kind_at: int, kind: str) -> bool:
    """Whether a row group's ``kind`` statistics admit ``kind`` (no statistics: it may)."""
    stats = group.column(kind_at).statistics
    if stats is None or not stats.has_min_max:
        return True
    return stats.min <= kind <= stats.max


def _narrow(table: pa.Table) -> pa.Table:
    """Drop the field columns that are null in every row (readers fill them back)."""
    keep = [
        i for i, (name, col) in enumerate(zip(table.column_names, table.columns, strict=True))
        if name in ENVELOPE.names or col.null_count < table.num_rows
    ]  # fmt: skip
    return table.select(keep)


def _canonical(table: pa.Table) -> pa.Table:
    """Columns in the order of SCHEMA, unknown (newer) columns last."""
    names = [n for n in SCHEMA.names if n in table.column_names]
    names += [n for n in table.column_names if n not in SCHEMA.names]
    return table.select(names)


def unreadable_part(path: Path | str, err: Exception) -> LogError:
    """The error for a part file that is not readable Parquet (damaged, truncated)."""
    return LogError(f"{path}: not a readable Parquet part of the log ({err})")


def damaged_part(part: Part, problem: str) -> PartDamagedError:
    """The error for a part whose bytes are not what was published, with what to do next."""
    run = part.path.parent.parent.name
    return PartDamagedError(
        f"{part.path}: damaged ({problem}); it holds {part.seqs} - 'verify {run}' checks every "
        f"part, 'quarantine {run} {part.path.name}' moves it (and the parts after it) aside"
    )


CHECKSUM_MISMATCH = "its content does not match the checksum its name records"


def check_part(part: Part, source: bytes | BinaryIO | None = None) -> pa.Schema:
    """The columns of a published part, once its content and footer agree with the log.

    What every reader checks before it uses a part: the checksum its name records,
    over every byte (PartDamagedError: a damaged page, a changed value, a truncated
    or rewritten file), then the footer (:func:`part_schema`). ``source`` is the
    part's bytes when the caller read them, or a handle the caller opened (read
    once, streaming, then left at its start); otherwise the file is read once,
    streaming. A part removed meanwhile raises FileNotFoundError (readers list again).
    """
    if isinstance(source, bytes):
        if part.digest is not None and content_digest(source) != part.digest:
            raise damaged_part(part, CHECKSUM_MISMATCH)
        return part_schema(part, pa.BufferReader(source))
    try:
        with open(part.path, "rb") if source is None else contextlib.nullcontext(source) as fh:
            if part.digest is not None and content_digest(fh) != part.digest:
                raise damaged_part(part, CHECKSUM_MISMATCH)
            schema = part_schema(part, fh)
            fh.seek(0)
            return schema
    except FileNotFoundError:
        raise
    except OSError as err:  # an I/O error of the disk
        raise unreadable_part(part.path, err) from err


def part_schema(part: Part, source: BinaryIO | pa.BufferReader | None = None) -> pa.Schema:
    """The columns of a published part, once its footer agrees with the log.

    Reads only the Parquet footer (of ``source``, an open handle, or the file).
    LogError names the part when it is not readable Parquet, lacks an envelope
    column, has a column typed unlike the log's, or does not hold exactly the seqs
    its name says (a foreign or altered file would otherwise be read as events).
    A part removed meanwhile raises FileNotFoundError (readers list again).
    """
    try:
        meta = pq.read_metadata(part.path if source is None else source)
        schema = meta.schema.to_arrow_schema()
    except pa.ArrowInvalid as err:
        raise unreadable_part(part.path, err) from err
    problem = _part_problem(part, meta, schema)
    if problem:
        raise LogError(f"{part.path}: not a part of this log ({problem})")
    return schema


def _part_problem(part: Part, meta: pq.FileMetaData, schema: pa.Schema) -> str | None:
    missing = [n for n in ENVELOPE.names if n not in schema.names]
    if missing:
        return f"no {', '.join(missing)} column"
    for field in schema:
        if field.name in SCHEMA.names and field.type != SCHEMA.field(field.name).type:
            return f"column {field.name} is {field.type}, the log's is {SCHEMA.field(field.name).type}"
    if meta.num_rows != part.rows:
        return f"{meta.num_rows} rows, its name says seqs {part.first}..{part.last}"
    seq = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == "seq")
    stats = [meta.row_group(r).column(seq).statistics for r in range(meta.num_row_groups)]
    if stats and all(s is not None and s.has_min_max for s in stats):
        low, high = min(s.min for s in stats), max(s.max for s in stats)
        if (low, high) != (part.first, part.last):
            return f"seqs {low}..{high}, its name says {part.first}..{part.last}"
    return None


def content_problem(part: Part, data: bytes) -> str | None:
    """Everything wrong with a part's bytes, read whole (``verify``): None when intact.

    Beyond what readers check (checksum, footer), every page of every row group is
    decoded and the seqs must be exactly ``first..last``, each once, with a kind:
    this also catches a part written wrong (a checksum only proves it unchanged).
    """
    if part.digest is not None and content_digest(data) != part.digest:
        return CHECKSUM_MISMATCH
    try:
        part_schema(part, pa.BufferReader(data))
        parquet = pq.ParquetFile(pa.BufferReader(data))
        seqs = []
        for group in range(parquet.num_row_groups):  # one row group in memory at a time
            rows = parquet.read_row_group(group)
            if rows.column("kind").null_count:
                return f"row group {group} has an event without a kind"
            seqs.append(rows.column("seq").combine_chunks())
    except LogError as err:
        return str(err).removeprefix(f"{part.path}: ")
    except (pa.ArrowInvalid, OSError) as err:
        return f"a page does not decode ({err})"
    found = pa.concat_arrays(seqs) if seqs else pa.array([], pa.int64())
    if found.null_count:
        return "an event has no seq"
    ordered = found.take(pc.sort_indices(found))
    wanted = pa.array(range(part.first, part.last + 1), pa.int64())
    if len(ordered) != len(wanted):  # the footer's row count agreed with the name: pages lied
        return f"{len(ordered)} events decode, its name says {part.seqs}"
    wrong = pc.indices_nonzero(pc.not_equal(ordered, wanted))
    if len(wrong):
        i = wrong[0].as_py()
        return f"its seqs are not {part.first}..{part.last} each once (seq {wanted[i]} is {ordered[i]})"
    return None


def _read_whole(part: Part) -> pa.Table:
    """One part file as written, checked as every reader checks it."""
    try:
        data = part.path.read_bytes()
        check_part(part, data)
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable_part(part.path, err) from err


def _row_groups(table: pa.Table) -> list[pa.Table]:
    """A merged part's rows as row groups, seq order in each: the large kinds', then the rest.

    The merged parts may hold their rows grouped by kind, so each group's row numbers
    are put in seq order; then one ``take`` reorders the rows (a merged table has a
    chunk per merged part, where a filter per group costs 2-3x as much), and the
    groups are slices of it.
    """
    kind, seq = table.column("kind"), table.column("seq")
    counts = pc.value_counts(kind).to_pylist()
    large = sorted(c["values"] for c in counts if c["counts"] * GROUP_SHARE >= table.num_rows)
    masks = [pc.equal(kind, k) for k in large]
    masks.append(pc.invert(pc.is_in(kind, pa.array(large, pa.string()))))
    rows = [r.take(pc.sort_indices(seq.take(r))) for r in map(pc.indices_nonzero, masks) if len(r)]
    ordered = table.take(pa.concat_arrays(rows))
    groups, start = [], 0
    for r in rows:
        groups.append(ordered.slice(start, len(r)))
        start += len(r)
    return groups


def write_part(table: pa.Table, sink: BinaryIO | str | pa.NativeFile, level: int) -> None:
    """Write the rows of a part at its level: flushed (0, in seq order) or merged."""
    if level == 0:
        pq.write_table(table, sink, compression="zstd", compression_level=1)
        return
    with pq.ParquetWriter(sink, table.schema, compression="zstd", compression_level=3) as writer:
        for group in _row_groups(table):
            writer.write_table(group)


def encode_part(table: pa.Table, level: int) -> tuple[pa.Buffer, str]:
    """The bytes of a part holding ``table`` at ``level``, and their checksum."""
    sink = pa.BufferOutputStream()
    write_part(table, sink, level)
    data = sink.getvalue()
    return data, content_digest(memoryview(data))


def _read_part(source: BinaryIO, columns: list[str] | None, part: Part) -> pa.Table:
    """One part with the columns of SCHEMA (or those asked for), absent fields as nulls."""
    try:
        data = source.read()
        present = set(check_part(part, data).names)
        buffer = pa.BufferReader(data)
        if columns is None:
            table = pq.read_table(buffer)
            columns = SCHEMA.names + [c for c in table.column_names if c not in SCHEMA.names]
        else:  # only the columns asked for are decoded
            wanted = [c for c in columns if c in present]
            if part.level and "seq" not in wanted:
                wanted.append("seq")  # to sort by, below
            table = pq.read_table(buffer, columns=wanted)
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable_part(part.path, err) from err
    if part.level:  # a merged part holds its rows grouped by kind; a flushed one is in seq order
        table = table.sort_by("seq")
    arrays = []
    for name in columns:
        if name in table.column_names:
            arrays.append(table.column(name))
        else:  # written by an older schema version: the field did not exist yet
            arrays.append(pa.nulls(table.num_rows, SCHEMA.field(name).type))
    return pa.Table.from_arrays(arrays, names=columns)


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


class LogWriter:
    """The single appender of one run (holds an exclusive lock until closed)."""

    def __init__(self, log: EventLog, fanout: int = FANOUT) -> None:
        self.log = log
        self.fanout = fanout
        self._lock = WriterLock(log)
        self._parts: list[Part] = []
        self._pending: list[pa.Table] = []
        self._cache: dict[Path, pa.Table] = {}
        self._tmp_counter = 0

    # -- opening and closing

    @classmethod
    def create(cls, data_dir: Path | str, run_id: str) -> LogWriter:
        """Open a new, empty run for appending; refuse a run that has events."""
        log = EventLog(data_dir, run_id)
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

    def _acquire(self) -> None:
        self._lock.acquire()
        try:
            self._recover()
        except BaseException:
            self._lock.release()
            raise

    def _recover(self) -> None:
        """Remove what a crash left behind, and refuse a log whose parts do not check.

        Unpublished temp files and the parts a merge superseded are removed. Every
        part is then checked as a reader checks it (checksum and footer): nothing is
        appended after a damaged part until ``quarantine`` moved it aside. A part
        written before checksums gets one once every page decodes (it is renamed).
        """
        for name in os.listdir(self.log.log_dir):
            if name.startswith(".tmp-"):
                (self.log.log_dir / name).unlink(missing_ok=True)
        listed = _list_parts(self.log.log_dir)
        chosen, problem = _cover(listed)
        if problem is not None:
            msg = (f"{self.log.log_dir}: {problem} - the log is inconsistent; nothing was appended "
                   f"('verify {self.log.run_id}' says what is intact)")  # fmt: skip
            raise LogError(msg)
        for part in set(listed) - set(chosen):
            part.path.unlink()
        try:
            self._parts = [self._adopt(p) if p.digest is None else self._checked(p) for p in chosen]
        except PartDamagedError as err:
            raise PartDamagedError(f"run {self.log.run_id!r} does not verify, nothing was appended: {err}") from err

    @staticmethod
    def _checked(part: Part) -> Part:
        check_part(part)
        return part

    def _adopt(self, part: Part) -> Part:
        """A part written before checksums, renamed with its checksum once its content is whole."""
        data = part.path.read_bytes()
        problem = content_problem(part, data)
        if problem is not None:
            raise damaged_part(part, problem)
        adopted = Part(part.first, part.last, part.level,
                       part.path.with_name(part_name(part.first, part.last, part.level, content_digest(data))),
                       content_digest(data))  # fmt: skip
        os.rename(part.path, adopted.path)
        _fsync_dir(self.log.log_dir)
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

    def flush(self) -> None:
        """Publish every staged event as one part file (atomic), then compact."""
        if not self._pending:
            return
        table = (
            pa.concat_tables(self._pending, promote_options="default")
            if len(self._pending) > 1 else self._pending[0]
        )  # fmt: skip
        first = self._published_tail() + 1
        part = self._publish(_canonical(_narrow(table)), first, first + table.num_rows - 1, 0)
        self._pending = []
        self._parts.append(part)
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

    def _publish(self, table: pa.Table, first: int, last: int, level: int) -> Part:
        self._tmp_counter += 1
        tmp = self.log.log_dir / f".tmp-{os.getpid()}-{self._tmp_counter}.parquet"
        final = self.log.log_dir / f"part-{first:012d}-{last:012d}-L{level}.parquet"  # named in errors
        try:
            data, digest = encode_part(table, level)
            final = final.with_name(part_name(first, last, level, digest))
            with open(tmp, "wb") as fh:
                fh.write(memoryview(data))
                fh.flush()
                os.fsync(fh.fileno())
            crash_point("publish.written")
            os.rename(tmp, final)
            crash_point("publish.renamed")
            _fsync_dir(self.log.log_dir)
        except OSError as err:  # a full disk, a quota: what is published stays intact
            tmp.unlink(missing_ok=True)
            tail = self._published_tail()
            kept = f"the log is intact up to seq {tail}" if tail else "nothing of the run was published"
            msg = f"{final}: cannot write this part of the log ({err.strerror or err}); {kept}"
            raise LogError(msg) from err
        part = Part(first, last, level, final, digest)
        if level < CACHED_LEVELS:
            self._cache[final] = table
        return part

    def _compact(self) -> None:
        """Merge the newest FANOUT parts while they share one level.

        The parts it merges come from the writer's cache, or from disk checked as
        every reader checks them; the merged part is published before they are removed.
        """
        while len(self._parts) >= self.fanout:
            tail = self._parts[-self.fanout :]
            level = tail[0].level
            if any(p.level != level for p in tail):
                return
            tables = [self._cache.pop(p.path, None) for p in tail]
            tables = [t if t is not None else _read_whole(p) for t, p in zip(tables, tail, strict=True)]
            merged = _canonical(pa.concat_tables(tables, promote_options="default"))
            part = self._publish(merged, tail[0].first, tail[-1].last, level + 1)
            crash_point("compact.published")
            for i, old in enumerate(tail):
                old.path.unlink()
                if i == 0:
                    crash_point("compact.removing")
            _fsync_dir(self.log.log_dir)
            self._parts[-self.fanout :] = [part]

    def file_count(self) -> int:
        """Number of published part files."""
        return len(self._parts)
