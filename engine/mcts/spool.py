"""The spool: finished turns kept on disk until the log holds them (rounds mode).

In ``rounds`` mode a turn that finished waits for the other turns of its batch
before the batch is recorded in order; its facts wait here, so a killed run loses
no finished turn: the resumed run takes them from the spool instead of running
them again.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from ingest.events import Event, from_row, to_arrow
from ingest.faults import crash_point
from ingest.log import content_digest

SPOOL_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # spooled rows are renumbered when appended


class Spool:
    """One Arrow IPC file per finished turn under ``<run>/spool/``.

    A private cache, not the log: cheaper to write than Parquet, and exact. Each file
    is written to a temporary name and renamed, so a killed process leaves the whole
    file or none; it is removed once its turn is in the log. Files are not fsynced
    (that cost more than a zero-latency turn): the spool only spares re-running a
    turn after a kill. As a log part's, a spool file's name records a checksum of
    its bytes (``<edge>--t<turn>-<sha>.arrow``): a file that a crash of the machine
    left unreadable or damaged is dropped, so its turn runs again instead of its
    facts entering the log wrong. Workers write one at a time: building Arrow arrays
    releases the GIL at every call, and 32 threads doing it at once took 3x as long as
    one after another (measured with the sim Teacher).
    """

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir) / "spool"
        self._lock = threading.Lock()

    @staticmethod
    def _stem(edge_id: str, turn: int) -> str:
        return f"{edge_id.replace('/', '~')}--t{turn}-"

    def _files(self, edge_id: str, turn: int) -> list[Path]:
        stem = self._stem(edge_id, turn)
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(self.dir / n for n in names if n.startswith(stem) and n.endswith(".arrow"))

    def put(self, edge_id: str, turn: int, facts: list[Event]) -> None:
        """Keep a finished turn's facts; a write the OS refuses is skipped (a cache)."""
        with self._lock:
            table = to_arrow(facts, "spool", 1, SPOOL_TIME)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
            data = sink.getvalue()
            final = self.dir / f"{self._stem(edge_id, turn)}{content_digest(memoryview(data))}.arrow"
            tmp = final.with_name(f".tmp-{final.name}")
            try:
                self.dir.mkdir(exist_ok=True)
                with open(tmp, "wb") as fh:
                    fh.write(memoryview(data))
                crash_point("spool.written")
                os.rename(tmp, final)
                crash_point("spool.renamed")
            except OSError:  # the turn stays in memory until the log has it
                tmp.unlink(missing_ok=True)

    def take(self, edge_id: str, turn: int) -> list[Event] | None:
        """The spooled facts of a turn, or None (not spooled, or torn or damaged by a machine crash)."""
        for path in self._files(edge_id, turn):
            try:
                data = path.read_bytes()
                if content_digest(data) == path.stem.rsplit("-", 1)[1]:
                    with pa.ipc.open_file(pa.BufferReader(data)) as spooled:
                        return [from_row(r) for r in spooled.read_all().to_pylist()]
            except (OSError, pa.ArrowInvalid):
                pass
            path.unlink(missing_ok=True)  # torn or damaged: the turn runs again
        return None

    def drop(self, edge_id: str, turn: int) -> None:
        """Forget a turn the log now holds."""
        for path in self._files(edge_id, turn):
            path.unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove the spool (the run is finished)."""
        if self.dir.exists():
            for p in self.dir.iterdir():
                p.unlink()
            self.dir.rmdir()
