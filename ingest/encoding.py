"""Encoding a part: the columns it keeps, their order, its row groups, its bytes and their checksum.

A flushed part (level 0) is one row group in seq order; a merged part (level > 0)
gives each kind holding at least 1/``GROUP_SHARE`` of its rows a row group of its own
and the other rows one more (seq order within each): a load of one kind then skips
the row groups whose ``kind`` statistics exclude it.
"""

from __future__ import annotations

from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.columns import ENVELOPE, SCHEMA
from ingest.parts import content_digest

# A kind with at least 1/GROUP_SHARE of a merged part's rows gets a row group of its own
# (the tool calls, ~85% of a run's events): the catalog's scans of the other kinds skip
# it. A flushed part, small, stays one row group. Measured: benchmarks/README.md ("Measurements behind decisions").
GROUP_SHARE = 8


def narrow(table: pa.Table) -> pa.Table:
    """Drop the field columns that are null in every row (readers fill them back)."""
    keep = [
        i
        for i, (name, col) in enumerate(zip(table.column_names, table.columns, strict=True))
        if name in ENVELOPE.names or col.null_count < table.num_rows
    ]
    return table.select(keep)


def canonical(table: pa.Table) -> pa.Table:
    """Columns in the order of SCHEMA, unknown (newer) columns last."""
    names = [n for n in SCHEMA.names if n in table.column_names]
    names += [n for n in table.column_names if n not in SCHEMA.names]
    return table.select(names)


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
