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

SPOOL_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # spooled rows are renumbered when appended


class Spool:
    """One Arrow IPC file per finished turn under ``<run>/spool/``.

    A private cache, not the log: cheaper to write than Parquet, and exact. Each file
    is written to a temporary name and renamed, so a killed process leaves the whole
    file or none; it is removed once its turn is in the log. Files are not fsynced
    (that cost more than a zero-latency turn): the spool only spares re-running a
    turn after a kill, and a file that a crash of the machine left unreadable is
    dropped, so its turn runs again. Workers write one at a time: building Arrow
    arrays releases the GIL at every call, and 32 threads doing it at once took 3x as
    long as one after another (measured with the sim Teacher).
    """

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir) / "spool"
        self._lock = threading.Lock()

    def _path(self, edge_id: str, turn: int) -> Path:
        return self.dir / f"{edge_id.replace('/', '~')}--t{turn}.arrow"

    def put(self, edge_id: str, turn: int, facts: list[Event]) -> None:
        """Keep a finished turn's facts; a write the OS refuses is skipped (a cache)."""
        final = self._path(edge_id, turn)
        tmp = final.with_name(f".tmp-{final.name}")
        with self._lock:
            table = to_arrow(facts, "spool", 1, SPOOL_TIME)
            try:
                self.dir.mkdir(exist_ok=True)
                with open(tmp, "wb") as fh, pa.ipc.new_file(fh, table.schema) as out:
                    out.write_table(table)
                crash_point("spool.written")
                os.rename(tmp, final)
                crash_point("spool.renamed")
            except OSError:  # the turn stays in memory until the log has it
                tmp.unlink(missing_ok=True)

    def take(self, edge_id: str, turn: int) -> list[Event] | None:
        """The spooled facts of a turn, or None (not spooled, or torn by a machine crash)."""
        path = self._path(edge_id, turn)
        if not path.exists():
            return None
        try:
            with pa.ipc.open_file(path) as spooled:
                rows = spooled.read_all().to_pylist()
        except (OSError, pa.ArrowInvalid):  # torn: run the turn again
            path.unlink(missing_ok=True)
            return None
        return [from_row(r) for r in rows]

    def drop(self, edge_id: str, turn: int) -> None:
        """Forget a turn the log now holds."""
        self._path(edge_id, turn).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove the spool (the run is finished)."""
        if self.dir.exists():
            for p in self.dir.iterdir():
                p.unlink()
            self.dir.rmdir()
