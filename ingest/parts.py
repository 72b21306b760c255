"""Part files: their names (seq range, level, checksum), their checksums and their encoding.

A part is an immutable Parquet file holding the events of seqs ``first..last``,
named ``part-<first>-<last>-L<level>-<sha>.parquet``: ``<sha>`` is the first 128
bits of the SHA-256 of its bytes, computed before they are written, so no change
to the bytes can also change the name that was published with them. A name
without ``<sha>`` was written before checksums. A flushed part (level 0) is one
row group in seq order; a merged part (level > 0) gives each kind holding at
least 1/``GROUP_SHARE`` of its rows a row group of its own and the other rows one
more (seq order within each): a load of one kind then skips the row groups whose
``kind`` statistics exclude it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.schema import ENVELOPE, SCHEMA

# A kind with at least 1/GROUP_SHARE of a merged part's rows gets a row group of its own
# (the tool calls, ~85% of a run's events): the catalog's scans of the other kinds skip
# it. A flushed part, small, stays one row group. Measured: docs/DECISIONS.md.
GROUP_SHARE = 8
DIGEST_CHARS = 32  # hex digits of a part's SHA-256 its name records (128 bits)
PART_RE = re.compile(rf"^part-(\d{{12}})-(\d{{12}})-L(\d+)(?:-([0-9a-f]{{{DIGEST_CHARS}}}))?\.parquet$")


@dataclass(frozen=True, order=True)
class Part:
    """One part file covering seqs ``first..last``; ``path`` is where it is read from."""

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

    @property
    def name(self) -> str:
        """The part's published name (its file may still be under its temporary name)."""
        if self.digest is None:
            return self.path.name
        return part_name(self.first, self.last, self.level, self.digest)


def parse_part(path: Path) -> Part | None:
    """The part a file name denotes, or None when the name is not a part's."""
    m = PART_RE.match(path.name)
    return Part(int(m[1]), int(m[2]), int(m[3]), path, m[4]) if m else None


def part_name(first: int, last: int, level: int, digest: str) -> str:
    """The file name of a published part."""
    return f"part-{first:012d}-{last:012d}-L{level}-{digest}.parquet"


def content_digest(data: bytes | memoryview | BinaryIO) -> str:
    """The checksum a part's name records: SHA-256 of its bytes (or an open file's), shortened."""
    full = hashlib.sha256(data) if isinstance(data, bytes | memoryview) else hashlib.file_digest(data, "sha256")
    return full.hexdigest()[:DIGEST_CHARS]


def narrow(table: pa.Table) -> pa.Table:
    """Drop the field columns that are null in every row (readers fill them back)."""
    keep = [
        i for i, (name, col) in enumerate(zip(table.column_names, table.columns, strict=True))
        if name in ENVELOPE.names or col.null_count < table.num_rows
    ]  # fmt: skip
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
