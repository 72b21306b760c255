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

from ingest.events import Event, SpoolEntryDropped
from ingest.faults import crash_point
from ingest.log import content_digest
from ingest.paths import write_atomically
from ingest.schema import from_row, to_arrow

SPOOL_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # spooled rows are renumbered when appended


class Spool:
    """One Arrow IPC file per finished turn under ``<run>/spool/``, bound to its run and start.

    A private cache, not the log: cheaper to write than Parquet, and exact. Each file
    is written to a temporary name and renamed, so a killed process leaves the whole
    file or none; it is removed once its turn is in the log. Files are not fsynced
    (that cost more than a zero-latency turn): the spool only spares re-running a
    turn after a kill. As a log part's, a spool file's name records a checksum of
    its bytes (``<edge>--t<turn>-<sha>.arrow``), and the file records the run it
    belongs to (``identity``: the run's record, so not another run of the same id)
    and the digest of the state its turn started from (``start``). A file that is
    damaged, torn, another run's or kept for another start (a stale one: the log it
    followed was cut back) is dropped when taken, said in :attr:`dropped`, and its
    turn runs again. Workers write one at a time: building Arrow arrays releases the
    GIL at every call, and 32 threads doing it at once took 3x as long as one after
    another (measured with the sim Teacher).
    """

    def __init__(self, run_dir: Path, identity: str = "") -> None:
        self.dir = Path(run_dir) / "spool"
        self.identity = identity
        self.dropped: list[SpoolEntryDropped] = []  # facts for the log: files not taken
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

    def put(self, edge_id: str, turn: int, facts: list[Event], start: str = "") -> None:
        """Keep a finished turn's facts (``start``: its start state's digest); a refused write is skipped."""
        with self._lock:
            table = to_arrow(facts, "spool", 1, SPOOL_TIME)
            table = table.replace_schema_metadata({"run": self.identity, "start": start})
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
            data = sink.getvalue()
            final = self.dir / f"{self._stem(edge_id, turn)}{content_digest(memoryview(data))}.arrow"

            def write(tmp: Path) -> None:
                tmp.write_bytes(memoryview(data))
                crash_point("spool.written")

            try:
                self.dir.mkdir(exist_ok=True)
                write_atomically(final, write, durable=False)
                crash_point("spool.renamed")
            except OSError:  # the turn stays in memory until the log has it
                pass

    def take(self, edge_id: str, turn: int, start: str = "", tree_id: str = "") -> list[Event] | None:
        """The spooled facts of a turn started from ``start``, or None (not spooled, or dropped)."""
        for path in self._files(edge_id, turn):
            reason = self._problem(path, start)
            if isinstance(reason, list):
                return reason
            path.unlink(missing_ok=True)  # the turn runs again
            self.dropped.append(
                SpoolEntryDropped(
                    tree_id=tree_id or edge_id.split("/")[0].split(".")[0], edge_id=edge_id, turn=turn, reason=reason
                )
            )
        return None

    def _problem(self, path: Path, start: str) -> list[Event] | str:
        """The file's facts, or why they are not taken."""
        try:
            data = path.read_bytes()
            if content_digest(data) != path.stem.rsplit("-", 1)[1]:
                return f"{path.name}: its content does not match its checksum (damaged or torn)"
            with pa.ipc.open_file(pa.BufferReader(data)) as spooled:
                table = spooled.read_all()
        except (OSError, pa.ArrowInvalid) as err:
            return f"{path.name}: unreadable ({err})"
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if meta.get("run", "") != self.identity:
            return f"{path.name}: kept by another run (or another run of this id)"
        if meta.get("start", "") != start:
            return f"{path.name}: kept for another start state of the edge (the log it followed was cut back)"
        return [from_row(r) for r in table.to_pylist()]

    def drained(self) -> list[SpoolEntryDropped]:
        """The facts of the files dropped since the last call (for the log)."""
        out, self.dropped = self.dropped, []
        return out

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
