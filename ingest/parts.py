"""Part files: their names (seq range, level, checksum) and their checksums (their encoding: encoding.py).

A part is an immutable Parquet file holding the events of seqs ``first..last``,
named ``part-<first>-<last>-L<level>-<sha>.parquet``: ``<sha>`` is the first 128
bits of the SHA-256 of its bytes, computed before they are written, so no change
to the bytes can also change the name that was published with them. A name
without ``<sha>`` was written before checksums. Nothing here opens a part: a reader
that only lists a run's parts (a warm read of derived state) loads no Parquet code.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
