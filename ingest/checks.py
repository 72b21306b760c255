"""What every reader checks before it uses a part, and what ``verify`` checks beyond that.

A reader checks the checksum its name records over every byte, then the footer:
the envelope columns, the log's column types, exactly the seqs its name says, and
the run id of every event (a part copied from another run is damage). ``verify``
also decodes every page and requires each seq of the part's range exactly once.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.columns import ENVELOPE, SCHEMA
from ingest.errors import LogError, PartDamagedError
from ingest.parts import Part, content_digest
from ingest.paths import log_command

CHECKSUM_MISMATCH = "its content does not match the checksum its name records"


def run_of(part: Part) -> str:
    """The id of the run whose log holds ``part`` (``<data>/runs/<run>/log/<part>``)."""
    return part.path.parent.parent.name


def unreadable_part(path: Path | str, err: Exception) -> LogError:
    """The error for a part file that is not readable Parquet (damaged, truncated)."""
    return LogError(f"{path}: not a readable Parquet part of the log ({err})")


def damaged_part(part: Part, problem: str) -> PartDamagedError:
    """The error for a part whose bytes are not what was published, with what to do next."""
    run = run_of(part)
    data = Path(part.path).parents[3]  # <data>/runs/<run>/log/<part>
    return PartDamagedError(
        f"{part.path}: damaged ({problem}); it holds {part.seqs} - '{log_command(data, 'verify', run)}' checks "
        f"every part, '{log_command(data, 'quarantine', run, part.name)}' moves it (and the parts after it) aside"
    )


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
    column, has a column typed unlike the log's, does not hold exactly the seqs
    its name says, or holds events of another run (a foreign or altered file would
    otherwise be read as events). A part removed meanwhile raises FileNotFoundError.
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


def _column_stats(meta: pq.FileMetaData, name: str) -> list:
    at = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == name)
    return [meta.row_group(r).column(at).statistics for r in range(meta.num_row_groups)]


def _part_problem(part: Part, meta: pq.FileMetaData, schema: pa.Schema) -> str | None:
    missing = [n for n in ENVELOPE.names if n not in schema.names]
    if missing:
        return f"no {', '.join(missing)} column"
    for field in schema:
        if field.name in SCHEMA.names and field.type != SCHEMA.field(field.name).type:
            return f"column {field.name} is {field.type}, the log's is {SCHEMA.field(field.name).type}"
    if meta.num_rows != part.rows:
        return f"{meta.num_rows} rows, its name says seqs {part.first}..{part.last}"
    stats = _column_stats(meta, "seq")
    if stats and all(s is not None and s.has_min_max for s in stats):
        low, high = min(s.min for s in stats), max(s.max for s in stats)
        if (low, high) != (part.first, part.last):
            return f"seqs {low}..{high}, its name says {part.first}..{part.last}"
    run = run_of(part)
    for s in _column_stats(meta, "run_id"):  # a writer always records them; a forger may not
        if s is not None and s.has_min_max and (s.min != run or s.max != run):
            other = s.min if s.min != run else s.max
            return f"it holds events of run {other!r}, not of {run!r}"
    return None


def content_problem(part: Part, data: bytes) -> str | None:
    """Everything wrong with a part's bytes, read whole (``verify``): None when intact.

    Beyond what readers check (checksum, footer), every page of every row group is
    decoded, every event must be of the part's run, and the seqs must be exactly
    ``first..last``, each once, with a kind: this also catches a part written wrong
    (a checksum only proves it unchanged).
    """
    if part.digest is not None and content_digest(data) != part.digest:
        return CHECKSUM_MISMATCH
    run = run_of(part)
    try:
        part_schema(part, pa.BufferReader(data))
        parquet = pq.ParquetFile(pa.BufferReader(data))
        seqs = []
        for group in range(parquet.num_row_groups):  # one row group in memory at a time
            rows = parquet.read_row_group(group)  # every page of the group decodes
            if rows.column("kind").null_count:
                return f"row group {group} has an event without a kind"
            foreign = pc.invert(pc.fill_null(pc.equal(rows.column("run_id"), run), False))
            if pc.any(foreign).as_py():
                return f"row group {group} holds events of another run than {run!r}"
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
