"""What a terminal shows of results: cells, tables, JSON and CSV, durations, a run's progress.

stdout carries data only (a table, one JSON document, CSV); progress goes to stderr. JSON
has no NaN or infinity: they are written as null. Every wall-clock figure comes from the
``run_progress``, ``run_pace`` and ``turns_in_flight`` views (a turn in flight's age is counted
against now); this module only lays them out.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

Row = dict[str, Any]
SPOOL_BYTES = 16 * 2**20  # characters of printed rows (and of a table's cells) held in memory, then in a temporary file
WIDE = 100  # a terminal narrower than this gets plain lines from watch


@dataclass
class Output:
    """What a command prints of its result: ``document`` with --json, ``csv`` (header, rows) with
    --csv, else ``lines`` of text (a table is one of them)."""

    document: Any
    lines: list[str] = field(default_factory=list)
    csv: tuple[list[str], Iterable[list[Any]]] | None = None

    def write(self, fmt: str, out: TextIO, echo: Callable[[str], None]) -> None:
        """Print it as ``fmt`` (text, json or csv): CSV to ``out``, the rest through ``echo``."""
        if fmt == "json":
            echo(json_text(self.document))
        elif fmt == "csv" and self.csv is not None:
            write_csv(out, *self.csv)
        else:
            for line in self.lines:
                echo(line)


def json_text(value: Any) -> str:
    """One JSON document, indented, NaN and infinities as null."""
    return json.dumps(finite(value), indent=2, default=str, allow_nan=False)


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def table(rows: list[Row], columns: list[str]) -> str:
    """An aligned text table of ``columns`` (``-`` for null, floats to 4 places)."""
    return "".join(table_chunks(columns, [[[r.get(c) for c in columns] for r in rows]]))[:-1]


def table_chunks(
    columns: list[str], batches: Iterable[list[Sequence[Any]]], check: Callable[[], None] = lambda: None
) -> Iterator[str]:
    """:func:`table`'s lines (each ending with a newline) of rows given in batches, a batch at a time.

    Every row is laid out before the first line (the columns' widths), so the cells are held
    (:class:`_Cells`: in memory up to SPOOL_BYTES, then in a temporary file); ``check`` is
    called before each batch's lines (a time limit: see ``Result.check``).
    """
    widths = [len(c) for c in columns]
    with _Cells() as cells:
        for batch in batches:
            part = [[cell(v) for v in row] for row in batch]
            if part:
                lengths = [list(map(len, values)) for values in zip(*part, strict=True)]
                widths = [max(w, *n) for w, n in zip(widths, lengths, strict=True)]
                cells.add(part, sum(map(sum, lengths)) + 60 * len(part) * len(columns))

        def line(values: list[str]) -> str:
            return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip() + "\n"

        yield line(columns)
        for part in cells:
            check()
            yield "".join(map(line, part))


class _Cells:
    """A table's cells, a batch (a list of rows) at a time: kept in memory until they take SPOOL_BYTES, then
    every batch in an unnamed temporary file of this process (pickled: read back only by it)."""

    def __init__(self) -> None:
        self._held: list[list[list[str]]] = []
        self._size = 0
        self._file = None

    def __enter__(self) -> _Cells:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._file is not None:
            self._file.close()

    def add(self, part: list[list[str]], size: int) -> None:
        self._held.append(part)
        self._size += size
        if self._size > SPOOL_BYTES:
            import pickle
            import tempfile

            self._file = self._file or tempfile.TemporaryFile()  # noqa: SIM115 - closed by __exit__
            for held in self._held:
                pickle.dump(held, self._file, pickle.HIGHEST_PROTOCOL)
            self._held = []

    def __iter__(self) -> Iterator[list[list[str]]]:
        if self._file is not None:
            import pickle

            end = self._file.tell()
            self._file.seek(0)
            while self._file.tell() < end:
                yield pickle.load(self._file)  # what add() wrote
        yield from self._held


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def write_csv(out: TextIO, header: list[str], rows: Iterable[list[Any]]) -> None:
    """CSV as Python's csv module writes it (lines end with CRLF)."""
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)


def csv_chunks(header: list[str], batches: Iterable[list[Sequence[Any]]]) -> Iterator[str]:
    """A query's rows as :func:`write_csv` writes them (lists and structs as JSON), a batch at a time."""
    out = io.StringIO()
    write_csv(out, header, [])
    for batch in batches:
        csv.writer(out).writerows([csv_cell(v) for v in row] for row in batch)
        yield out.getvalue()
        out = io.StringIO()  # (not truncated: a StringIO that was seeks holds 4 bytes a character)
    yield out.getvalue()


def json_chunks(columns: list[str], batches: Iterable[list[Sequence[Any]]]) -> Iterator[str]:
    """A query's rows as :func:`json_text` writes the list of them (each row an object), a batch at a time."""
    opening = "[\n  "
    for batch in batches:
        texts = [json_text(dict(zip(columns, row, strict=True))).replace("\n", "\n  ") for row in batch]
        if texts:
            yield opening + ",\n  ".join(texts)
            opening = ",\n  "
    yield "[]" if opening.startswith("[") else "\n]"


def row_chunks(
    fmt: str, columns: list[str], batches: Iterable[list[Sequence[Any]]], check: Callable[[], None] = lambda: None
) -> Iterator[str]:
    """A query's rows as ``sql`` prints them (``fmt``: text, json or csv), a batch at a time (see table_chunks)."""
    if fmt == "csv":
        yield from csv_chunks(columns, batches)
    elif fmt == "json":
        yield from json_chunks(columns, batches)
        yield "\n"
    else:
        yield from table_chunks(columns, batches, check)


def print_rows(fmt: str, out: TextIO, result: Any) -> None:
    """A query's rows (a ``Result``) printed to ``out`` as ``sql`` prints them, once they are all formatted.

    Fetching and formatting go a batch at a time (bounded in rows and bytes), the query's
    limits checked between batches (``result.check``); the text is spooled, so a query
    stopped prints nothing. Rows this process cannot hold (a MemoryError): QueryLimitError.
    """
    import shutil
    import tempfile

    from engine.results import Limits, QueryLimitError

    with tempfile.SpooledTemporaryFile(SPOOL_BYTES, "w+", encoding="utf-8", newline="") as spool:
        try:
            for chunk in row_chunks(fmt, result.columns, result.batches(), result.check):
                spool.write(chunk)
        except MemoryError:
            raise QueryLimitError(Limits.output_memory_message()) from None
        result.check()
        spool.seek(0)
        shutil.copyfileobj(spool, out)


def csv_cell(value: Any) -> Any:
    """A query result's cell in CSV: lists and structs as JSON."""
    return json.dumps(value, default=str) if isinstance(value, list | dict) else value


def rows_csv(rows: list[Row]) -> tuple[list[str], Iterable[list[Any]]]:
    """Rows of a query for CSV: their columns as the header, lists and structs as JSON."""
    columns = list(rows[0]) if rows else []
    return columns, ([csv_cell(r[c]) for c in columns] for r in rows)


def duration(seconds: float | None) -> str:
    """``1h 05m``, ``4m 12s``, ``9s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def time_left(seconds: float | None) -> str:
    """The estimate of ``run_pace``: ``estimating`` until it has data, whole seconds rounded up."""
    return "estimating" if seconds is None else duration(math.ceil(seconds))


def counted(n: int, noun: str) -> str:
    """``1 round``, ``2 rounds``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def progress_line(p: dict[str, Any], running: bool = True, eta: bool = True) -> str:
    """One line of a run's progress: a ``run_progress`` row with its ``run_pace`` columns.

    ``running``: whether a process writes the run (an interrupted run has no time left);
    ``eta``: whether to give the time left (a campaign's run has none of its own: its grants decide).
    """
    pace = f"{p['edges_per_hour']:,.0f} edges/h" if p.get("edges_per_hour") is not None else "- edges/h"
    left = f"ETA {time_left(p.get('eta_seconds'))}" if eta else "growing"
    state = "done" if p.get("finished") else left if running else "not running"
    return (
        f"trees {p['trees_done']}/{p['trees']} done | edges kept {p['kept_edges']} "
        f"({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, retried "
        f"{p['retried_edges']}, in flight {p['in_flight_edges']} | leaves {p['leaves']} | tool errors "
        f"{share(p['tool_errors'], p['tool_calls'])}, knowledge {share(p['knowledge_actions'], p['tool_calls'])} "
        f"| {pace} | {state}"
    )


class ProgressLine:
    """explore's progress on stderr: a live line on a terminal, else a line every ``period`` s."""

    def __init__(self, period: float = 60.0) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self.period = 1.0 if self.live else period
        self.last = time.monotonic()
        self._shown = False

    def __call__(self, read: Callable[[], dict[str, Any]]) -> None:
        now = time.monotonic()
        if now - self.last < self.period:
            return
        self.last = now
        line = progress_line(read())
        if self.live:  # one line, rewritten in place
            width = self.console.width
            self.console.file.write("\r\033[K" + (line if len(line) < width else line[: width - 1]))
            self.console.file.flush()
            self._shown = True
        else:
            self.console.print(line)

    def close(self) -> None:
        if self._shown:
            self.console.file.write("\n")
            self.console.file.flush()


def frame_header(frame: Any) -> list[str]:
    p, pace = frame.progress, frame.pace
    state = "finished" if frame.finished else "running" if frame.writing else "not running (interrupted)"
    stops = ", ".join(f"{reason} {n}" for reason, n in frame.stops.items()) or "none yet"
    now = datetime.now(UTC)
    oldest = min((t["since"] for t in frame.in_flight if t["since"]), default=None)
    eta = "none" if frame.finished else time_left(pace["eta_seconds"]) if frame.writing else "none (not running)"
    rate = lambda key: "-" if pace[key] is None else f"{pace[key]:,.0f}"  # noqa: E731
    return [
        f"run {frame.run_id} (task {frame.task}): {state} | log seq {frame.seq} | session "
        f"{duration(pace['session_seconds'])} | time left {eta}",
        f"trees  {p['trees']}: {p['trees_done']} done, {p['trees_running']} active; stopped by: {stops}",
        f"edges  kept {p['kept_edges']} ({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, "
        f"retried {p['retried_edges']}, in flight {p['in_flight_edges']} | leaves {p['leaves']}",
        f"turns  in flight {len(frame.in_flight)}"
        + (f" (the oldest for {duration((now - oldest).total_seconds())})" if oldest else ""),
        f"tools  {p['tool_calls']} calls, {share(p['tool_errors'], p['tool_calls'])} errors, "
        f"{share(p['knowledge_actions'], p['tool_calls'])} knowledge actions",
        f"pace   {rate('edges_per_hour')} edges/h, {rate('tokens_per_hour')} tokens/h",
    ]


def frame_view(frame: Any, height: int) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("tree", "stage", "status", "stop", "kept", "leaves", "in flight", "root", "best", "gain"):
        table.add_column(column, justify="right" if column not in ("tree", "stage", "status", "stop") else "left")
    shown = frame.trees[: max(3, height - 10)]
    for t in shown:
        gain = None if t["best_score"] is None or t["root_score"] is None else t["best_score"] - t["root_score"]
        table.add_row(
            t["tree_id"],
            t["stage"] or "-",
            t["status"],
            t["stop_reason"] or "-",
            str(t["kept_edges"]),
            str(t["final_leaves"] or t["good_leaves"]),
            str(t["in_flight_edges"]),
            cell(t["root_score"]),
            cell(t["best_score"]),
            "-" if gain is None else f"{gain:+.4f}",
        )
    lines = [Text(line) for line in frame_header(frame)]
    more = len(frame.trees) - len(shown)
    tail = [Text(f"... and {more} more trees")] if more else []
    return Group(*lines, Text(""), table, *tail)


def spend_line(edges: int, tokens: int, budget_edges: int | None, budget_tokens: int | None) -> str:
    """A campaign's spend, against its budget where it has one: ``spent 12/40 valid edges, 3.1M/200.0M tokens``."""
    of = f"/{budget_edges}" if budget_edges else ""
    of_tokens = f"/{budget_tokens / 1e6:.1f}M" if budget_tokens else ""
    return f"spent {edges}{of} valid edges, {tokens / 1e6:.1f}M{of_tokens} tokens"


def campaign_frame_lines(frame: Any) -> list[str]:
    """A campaign's frame: its state and spend against its budget, then a line per task's run."""
    c, st = frame.config, frame.state
    state = "finished" if frame.finished else "running" if frame.writing else "not running (interrupted)"
    stop = f", stopped: {st['stop_reason']}" if st["stop_reason"] else ""
    spend = spend_line(*frame.spent, c["budget_edges"], c["budget_tokens"])
    lines = [f"campaign {frame.name} ({c['policy']}): {state}; {counted(st['rounds'], 'round')}{stop}; {spend}"]
    lines += [f"  {r['task']} ({r['run_id']}): " + progress_line(r, frame.writing, eta=False) for r in frame.runs]
    return lines


def show_campaign_frames(frames: Iterable[Any], once: bool, echo: Callable[[str], None]) -> None:
    """watch of a campaign: its lines, live on a terminal (redrawn), else printed at each change."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(highlight=False)
    if once or not console.is_terminal:
        last = None
        for frame in frames:
            if frame.seqs != last:
                echo("\n".join(campaign_frame_lines(frame)))
                last = frame.seqs
            if once:
                return
        return
    with Live(console=console, auto_refresh=False, transient=False) as live:
        for frame in frames:
            live.update(Text("\n".join(campaign_frame_lines(frame))), refresh=True)


def show_frames(frames: Iterable[Any], once: bool, echo: Callable[[str], None]) -> None:
    """watch's output: a live view on a wide terminal, else a line per change (``once``: the first frame)."""
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    rich_view = console.is_terminal and console.width >= WIDE
    if once:
        frame = next(iter(frames))
        if rich_view:
            console.print(frame_view(frame, console.height))
        else:
            echo("\n".join(frame_header(frame)))
        return
    if rich_view:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for frame in frames:
                live.update(frame_view(frame, console.height), refresh=True)
        return
    last = None
    for frame in frames:
        if frame.seq != last or frame.finished:
            echo(f"{frame.run_id} seq {frame.seq}: " + progress_line(frame.progress | frame.pace, frame.writing))
            last = frame.seq
