"""A query's result, read a batch at a time within its limits: what ``sql`` and ``serve`` read with.

A query of a :class:`~engine.collection.Collection` runs on a cursor of its own (a DuckDB
connection serves one thread at a time), so queries run at once. Its :class:`Result`
is fetched a batch at a time: a reader holds a batch, not the result, and the query's
limits (:class:`Limits`: memory, and time from its start) are checked before each batch,
so the time a reader spends formatting counts as DuckDB's does. A batch is bounded in bytes
as well as rows (about BATCH_BYTES of Python values): rows of long values come a few at a
time, so neither the memory a reader holds nor the time between two checks grows with
them. A :class:`Cancel` stops
queries from another thread (a web client gone). ``write_parquet`` writes a result a
batch at a time, renamed into place once whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from engine.catalog.queries import QueryError, first_line
from ingest.errors import InputError, OutputError
from ingest.paths import outside_data, write_atomically

MEMORY_ENV = "TEACHER_MCTS_SQL_MEMORY"
TIMEOUT_ENV = "TEACHER_MCTS_SQL_TIMEOUT_S"
DEFAULT_MEMORY = "4GB"  # a 2-core, 24 GiB machine: several such queries, or one and a run, fit beside each other
DEFAULT_TIMEOUT_S = 300.0
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class QueryLimitError(QueryError):
    """A query went past its time or memory limit and was stopped; nothing was written."""


class QueryCancelledError(QueryError):
    """A query stopped by its :class:`Cancel` (its reader went away); nothing more was read."""


CANCELLED = "the query was cancelled (its reader went away) - nothing more was read"
BATCH_ROWS = 10_000  # rows a batched read fetches at a time at most (sql's output, serve's CSV)
BATCH_BYTES = 16 * 2**20  # about the bytes of Python values a batch holds (rows of long values: fewer rows)
FIRST_VALUES = 20_000  # values of the first batch of short values (a row, when values can be long)
GROWTH = 8  # a batch has at most this many times the rows of the one before (each sized by the weight of the last)
VALUE_BYTES = 40  # a short value's bytes in a row (a Python int or float and its slot)

# Types whose values are short whatever the query; a value of any other (text, blob, list, struct, map...) may
# be long, and is weighed.
SHORT_TYPES = re.compile(
    r"(BOOLEAN|U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|FLOAT|DOUBLE|DECIMAL\(\d+, ?\d+\)|DATE|TIME|"
    r"TIME WITH TIME ZONE|TIMESTAMP(_S|_MS|_NS)?|TIMESTAMP WITH TIME ZONE|INTERVAL|UUID|\"NULL\")"
)


class Cancel:
    """Stops queries from another thread: interrupts every cursor running one (e.g. a web client went away).

    Calling it is for good: a query it watches that starts later stops at its first batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self.is_set = False

    def __call__(self) -> None:
        with self._lock:
            self.is_set = True
            for cursor in self._cursors:
                cursor.interrupt()

    @contextlib.contextmanager
    def watching(self, cursor: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """Interrupt ``cursor`` when called within this block (and not after: the cursor may be closed)."""
        with self._lock:
            self._cursors.append(cursor)
            if self.is_set:
                cursor.interrupt()
        try:
            yield
        finally:
            with self._lock:
                self._cursors.remove(cursor)


class Result:
    """A read-only query running on a cursor of its own (:meth:`Collection.result`).

    Its rows are fetched a batch at a time (``batches``: tuples; ``record_batches``: Arrow,
    one or the other), so a reader holds no more than a batch; before each batch the time
    limit and the Cancel are checked (``check``), so the time the reader takes between
    batches, formatting them, counts against the limit as DuckDB's does.
    """

    def __init__(
        self,
        cursor: duckdb.DuckDBPyConnection,
        query: str,
        *,
        limits: Limits,
        files: dict[str, tuple],
        rebind: Callable[[], dict[str, tuple]],
        in_transaction: bool,
        expired: Cancel,
        cancel: Cancel | None,
    ) -> None:
        """``files``: the stored files the query's views are bound to; ``rebind`` reads the runs again and
        binds them anew (a state replaced meanwhile); ``in_transaction``: the cursor holds one (a collection's)."""
        self._cursor, self._query, self._limits = cursor, query, limits
        self._files, self._rebind, self._in_transaction = files, rebind, in_transaction
        self._expired, self._cancel = expired, cancel
        self._started: str | None = None

    def check(self) -> None:
        """QueryLimitError once the time limit has passed, QueryCancelledError once cancelled."""
        if self._expired.is_set:
            raise QueryLimitError(self._limits.time_message())
        if self._cancel is not None and self._cancel.is_set:
            raise QueryCancelledError(CANCELLED)

    def _start(self, how: str, start):
        if self._started not in (None, how):
            raise RuntimeError("a result is read as rows or as Arrow batches, not both")
        if self._started == how:
            return None
        self.check()
        try:
            found = start()
        except duckdb.IOException:
            if all(Path(f).exists() for files in self._files.values() for f in files):
                raise
            # A state was replaced (its run grew) and dropped while bound: read the runs again.
            if self._in_transaction:  # (a query of one run holds none: its views are its own)
                self._cursor.rollback()
            self._files = self._rebind()
            found = start()
        self._started = how
        return found

    def described(self) -> tuple[list[str], list[str]]:
        """The result's column names and DuckDB types (``VARCHAR``, ``INTEGER[]``), the query bound, not run."""
        self.check()
        relation = self._cursor.sql(self._query)
        return relation.columns, [str(t) for t in relation.types]

    @property
    def columns(self) -> list[str]:
        """The result's column names (the query starts if it has not)."""
        self._start("rows", lambda: self._cursor.execute(self._query))
        return [d[0] for d in self._cursor.description]

    def batches(self, size: int = BATCH_ROWS, limit: int | None = None) -> Iterator[list[tuple]]:
        """The rows, at most ``size`` and about BATCH_BYTES at a time (``limit``: no more rows in all); the
        limits checked before each batch."""
        self._start("rows", lambda: self._cursor.execute(self._query))
        long = [not SHORT_TYPES.fullmatch(str(d[1])) for d in self._cursor.description]
        step, left = 1 if any(long) else max(1, min(size, FIRST_VALUES // max(1, len(long)))), limit
        while left is None or left > 0:
            self.check()
            batch = self._cursor.fetchmany(step if left is None else min(step, left))
            if not batch:
                break
            left = None if left is None else left - len(batch)
            yield batch
            step = max(1, min(size, GROWTH * len(batch), len(batch) * BATCH_BYTES // max(1, weight(batch, long))))
        self.check()

    def head(self, n: int) -> list[tuple]:
        """The first ``n`` rows (fewer if there are fewer): the rest is never fetched."""
        return [row for batch in self.batches(n, limit=n) for row in batch]

    def record_batches(self, size: int = BATCH_ROWS * 10):
        """The rows as an Arrow RecordBatchReader (``schema``, then its batches; the limits checked before each)."""
        import pyarrow as pa

        reader = self._start("arrow", lambda: self._cursor.sql(self._query).to_arrow_reader(size))

        def checked():
            batches = iter(reader)
            while True:
                self.check()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except OSError as err:  # DuckDB's error midway, through Arrow's stream: as the query's own
                    self.check()  # (an interrupt: the limit's or the Cancel's)
                    if str(err).startswith("Out of Memory Error"):
                        raise QueryLimitError(self._limits.memory_message(err)) from err
                    raise QueryError(first_line(err)) from err
                yield batch
            self.check()

        return pa.RecordBatchReader.from_batches(reader.schema, checked())


def weight(batch: list[tuple], long: list[bool]) -> int:
    """About the bytes of Python values ``batch`` holds (``long``: the columns whose values are weighed)."""
    columns = [i for i, is_long in enumerate(long) if is_long]
    total = len(batch) * (56 + VALUE_BYTES * (len(long) - len(columns)))
    for row in batch:
        total += sum(_size(row[i]) for i in columns)
    return total


def _size(value) -> int:
    if isinstance(value, str | bytes):
        return 49 + len(value)
    if isinstance(value, list | tuple):
        return 56 + sum(8 + _size(v) for v in value)
    if isinstance(value, dict):
        return 64 + sum(16 + _size(k) + _size(v) for k, v in value.items())
    return VALUE_BYTES


@dataclass(frozen=True)
class Limits:
    """What one query may take: memory beyond the loaded runs' (bytes), and seconds."""

    memory: int
    timeout_s: float
    memory_text: str  # as given, for messages

    @classmethod
    def resolve(cls, memory: str | None = None, timeout_s: float | str | None = None) -> Limits:
        """The limits given, else ``$TEACHER_MCTS_SQL_MEMORY`` / ``$TEACHER_MCTS_SQL_TIMEOUT_S``, else the defaults.

        InputError names a value that is not a size (``4GB``, ``512MiB``) or a positive number of seconds.
        """
        memory = memory or os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", memory.lower())
        if not m or float(m[1]) <= 0:
            msg = f"memory limit {memory!r} is not a size such as 4GB or 512MiB (--memory-limit, ${MEMORY_ENV})"
            raise InputError(msg)
        if timeout_s is None:
            timeout_s = os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S
        try:
            seconds = float(timeout_s)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            msg = f"time limit {timeout_s!r} is not a positive number of seconds (--timeout, ${TIMEOUT_ENV})"
            raise InputError(msg)
        return cls(int(float(m[1]) * UNITS[m[2] or "b"]), seconds, memory.strip())

    def memory_message(self, err: Exception) -> str:
        """What a query stopped at its memory limit (DuckDB's ``err``) says; or, when the machine refused the memory
        (an allocation failed below the limit: a ulimit, a container's limit), that."""
        if "(bad allocation)" in str(err):
            return (
                f"the query needed more memory than this process could get (below its limit of {self.memory_text}: "
                f"the machine's or the process's own limit refused it) and was stopped - nothing was written: "
                f"{first_line(err)}"
            )
        return (
            f"the query needed more memory than its limit of {self.memory_text} and was stopped - "
            f"nothing was written (give more with --memory-limit or ${MEMORY_ENV}): {first_line(err)}"
        )

    @staticmethod
    def output_memory_message() -> str:
        """What a query whose rows this process ran out of memory holding (a MemoryError) says."""
        return (
            "the query's rows needed more memory than this process could get and the query was stopped - "
            "nothing was written (a value or a row too large to hold: select fewer or shorter columns, e.g. "
            "left(text, 1000))"
        )

    def time_message(self) -> str:
        """What a query stopped at its time limit says."""
        return (
            f"the query ran past its time limit of {self.timeout_s:g} s and was stopped - "
            f"nothing was written (give more with --timeout or ${TIMEOUT_ENV})"
        )


def parquet_target(path: Path, data_dir: Path, overwrite: bool = False) -> Path:
    """``path`` if a query's result may be written there; OutputError (nothing run or written) otherwise.

    Never among the runs of the data directory (a run's log, its spool, its quarantine:
    the file would replace recorded events), and never onto an existing file unless
    ``overwrite``.
    """
    path = outside_data(path, data_dir, "the result")
    if path.exists() and not overwrite:
        raise OutputError(f"{path}: exists already - give --overwrite to replace it; nothing was run")
    return path


def write_parquet(batches, path: Path, data_dir: Path, overwrite: bool = False) -> int:
    """Write a query result (an Arrow RecordBatchReader, a batch at a time) to ``path`` atomically (a
    temporary file renamed once every batch is written); its row count.

    OutputError when :func:`parquet_target` refuses the path, or names the file when
    the machine refuses the write; nothing is left, nor when reading the batches fails (a limit).
    """
    import pyarrow.parquet as pq

    path = parquet_target(path, data_dir, overwrite)
    written = 0

    def write(tmp: Path) -> None:
        nonlocal written
        with pq.ParquetWriter(tmp, batches.schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                written += batch.num_rows

    try:
        write_atomically(path, write, "the result")
    except MemoryError:  # (Arrow's too): a clear error, the file not written
        raise QueryLimitError(Limits.output_memory_message()) from None
    return written
