"""Reading a run's log: the parts its record names, checked, as Arrow tables or batches of one kind.

Safe while the writer appends or merges: the record is read whole (a line being
written is not committed yet), and a part a merge removed after the record was read
is simply looked up again from a newer record.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.checks import check_part, unreadable_part
from ingest.columns import SCHEMA
from ingest.errors import LogError
from ingest.listing import Moved, has_log, located, run_ids, while_moving  # noqa: F401 - run_ids re-exported
from ingest.parts import Part
from ingest.paths import check_run_id, log_command, run_dir, under
from ingest.record import Record, legacy_cover, list_parts, read_record
from ingest.text import as_utf8


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
        self._checked_overlaps: dict[tuple[str, ...], str | None] = {}
        self._record: Record | None = None

    def record(self) -> Record | None:
        """The run's committed record of its parts (None: a run written before records).

        Read again each time (the writer appends), parsing only what was appended since
        this reader last read it.
        """
        self._record = read_record(self.log_dir, self.run_id, self._record)
        return self._record

    def exists(self) -> bool:
        """Whether the run has at least one published event (or a record, damaged or not)."""
        return has_log(self.log_dir, self.run_id)

    def require(self) -> EventLog:
        """Return self, or raise LogError naming the missing run."""
        if not self.exists():
            msg = f"run {self.run_id!r} not found {under(self.data_dir)}"
            raise LogError(msg)
        return self

    def parts(self) -> list[Part]:
        """The parts of the log in seq order, each at the path it is read from.

        The record's live parts; for a run written before records, the gapless cover of
        the part files (:meth:`legacy_parts`). A part a merge removed just after the
        record was read shows as missing; the record is then simply read again.
        """

        def listing() -> list[Part]:
            record = self.record()
            chosen, problem = self.legacy_parts() if record is None else located(record)
            if problem is not None:
                raise Moved(problem)
            return chosen

        verify = log_command(self.data_dir, "verify", self.run_id)
        return while_moving(self.log_dir, listing, f"the log is inconsistent ('{verify}' says what is intact)")

    def legacy_parts(self) -> tuple[list[Part], str | None]:
        """The parts of a run written before records: the widest gapless cover of its part files.

        Files that overlap the cover (what a crash in the middle of a merge left) must hold
        the same events as the cover does; otherwise one of them is not this run's and the
        log cannot be read (the problem names both).
        """
        listed = list_parts(self.log_dir)
        chosen, problem = legacy_cover(listed)
        if problem is not None:
            return chosen, problem
        others = [p for p in listed if p not in chosen]
        key = tuple(p.path.name for p in listed)
        if others and key not in self._checked_overlaps:
            self._checked_overlaps[key] = _overlap_problem(chosen, others)
        return chosen, self._checked_overlaps.get(key)

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
            tables = [read_part(fh, columns, part) for fh, part in zip(handles, parts, strict=True)]
        finally:
            for fh in handles:
                fh.close()
        if not tables:
            schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
            return pa.Table.from_batches([], schema)  # (Schema.empty_table() imports pandas)
        return pa.concat_tables(tables, promote_options="default")

    def scan_kind(
        self, kind: str, columns: list[str], upto: int | None = None, batch_rows: int = 1024, *, after: int = 0
    ) -> Iterator[pa.Table]:
        """The events of one kind in seq order, a batch at a time, only ``columns`` decoded.

        Only the row groups whose ``kind`` statistics admit the kind are read, and no
        more than ``batch_rows`` rows are decoded at once, so bulky columns of a large
        run are never all in memory. ``upto``: the last seq wanted (a reader's prefix);
        ``after``: the events up to this seq are not wanted (their parts are not read).
        """
        parts, handles = self._open_parts()
        try:
            for fh, part in zip(handles, parts, strict=True):
                if upto is not None and part.first > upto:
                    break
                if part.last <= after:
                    continue
                yield from _scan_part(fh, part, kind, columns, upto, batch_rows, after=after)
        finally:
            for fh in handles:
                fh.close()

    def _open_parts(self) -> tuple[list[Part], list[BinaryIO]]:
        """The parts of the published prefix, each opened right after listing.

        An open file stays readable even if compaction removes it meanwhile, so only
        the (short) opening can race; a part gone by then means listing again.
        """

        def opened() -> tuple[list[Part], list[BinaryIO]]:
            parts = self.parts()
            handles: list[BinaryIO] = []
            try:
                for part in parts:
                    handles.append(open(part.path, "rb"))  # noqa: SIM115 - the caller closes them
            except FileNotFoundError:
                for fh in handles:
                    fh.close()
                raise
            return parts, handles

        return while_moving(self.log_dir, opened, "parts kept disappearing while reading - try again")


def _overlap_problem(chosen: list[Part], others: list[Part]) -> str | None:
    """Whether each file overlapping the cover holds exactly the cover's events of its seqs."""
    for other in others:
        covering = [p for p in chosen if p.first <= other.last and other.first <= p.last]
        try:
            theirs = _events(other)
            ours = pa.concat_tables([_events(p) for p in covering], promote_options="default")
        except LogError as err:
            return str(err)
        ours = ours.filter(pc.and_(pc.greater_equal(ours["seq"], other.first), pc.less_equal(ours["seq"], other.last)))
        if not same_events(theirs, ours):
            names = ", ".join(p.path.name for p in covering)
            return (
                f"{other.path.name} and {names} hold seqs {other.first}..{other.last} with different events: "
                "one of them is not this run's"
            )
    return None


def _events(part: Part) -> pa.Table:
    with open(part.path, "rb") as fh:
        return read_part(fh, None, part)


def same_events(a: pa.Table, b: pa.Table) -> bool:
    """Whether two tables hold the same events (seq order, every column; absent columns are nulls)."""
    if a.num_rows != b.num_rows:
        return False
    types = {f.name: f.type for t in (b, a) for f in t.schema}
    names = sorted(types)

    def filled(t: pa.Table) -> pa.Table:
        t = t.sort_by("seq")
        columns = [t.column(n) if n in t.column_names else pa.nulls(t.num_rows, types[n]) for n in names]
        return pa.Table.from_arrays(columns, names=names)

    return filled(a).equals(filled(b), check_metadata=False)


def _scan_part(
    source: BinaryIO, part: Part, kind: str, columns: list[str], upto: int | None, batch_rows: int, *, after: int = 0
) -> Iterator[pa.Table]:
    """One part's rows of ``kind`` (``after`` < seq <= ``upto``) with ``columns``, batch by batch."""
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
            if after:
                keep = pc.and_(keep, pc.greater(table.column("seq"), after))
            table = table.filter(keep)
            if table.num_rows:
                yield pa.Table.from_arrays(
                    [
                        table.column(c) if c in table.column_names else pa.nulls(table.num_rows, SCHEMA.field(c).type)
                        for c in columns
                    ],
                    names=columns,
                )
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable_part(part.path, err) from err


def _may_hold(group: pq.RowGroupMetaData, kind_at: int, kind: str) -> bool:
    """Whether a row group's ``kind`` statistics admit ``kind`` (no statistics: it may)."""
    stats = group.column(kind_at).statistics
    if stats is None or not stats.has_min_max:
        return True
    return stats.min <= kind <= stats.max


def read_whole(part: Part) -> pa.Table:
    """One part file as written, checked as every reader checks it."""
    try:
        data = part.path.read_bytes()
        check_part(part, data)
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable_part(part.path, err) from err


def read_part(source: BinaryIO, columns: list[str] | None, part: Part) -> pa.Table:
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
