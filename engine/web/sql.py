"""The SQL page: a query POSTed by its form runs in a thread of its own while other pages answer.

A GET shows the form (the query of ``?q=`` in it, not run). A query is interrupted when its
client goes away; the page fetches only what it shows, bounded in rows and characters, a long
value cut by DuckDB (engine.web.sql_cells: a cut value's ``show all`` runs the query again for
it alone), and the CSV download streams every row a batch at a time, within the query's time
limit: a limit passed midway leaves the download unfinished (the client sees it fail), never a
short file that looks whole.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qs

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.types import Send

from engine.catalog.definitions import read_views
from engine.catalog.queries import check_query
from engine.collection import Cancel, QueryCancelledError
from engine.render import csv_chunks
from engine.web import data, sql_cells
from engine.web.pages import HEADERS, TEMPLATES, page, problem
from engine.web.sql_cells import CELL_CHARS, FULL_CHARS, PAGE_CHARS, SHOWN_COLUMNS, SHOWN_ROWS, Cut
from ingest.errors import ProjectError

CSV_BATCH_ROWS = 2_000  # rows of a CSV download fetched and sent at a time
CSV_AHEAD = 4  # batches of a CSV download made ahead of what its client has taken
FORM_BYTES = 2**20  # the largest form (a query) the SQL page takes
T = TypeVar("T")
TEMPLATES.tests["cut"] = lambda value: isinstance(value, Cut)  # (the page marks a value shown cut)
TEMPLATES.filters["id_links"] = lambda row, columns: sql_cells.id_links(columns, row)  # (an id cell: its page)


async def sql(request: Request) -> Response:
    """GET: the form (the query of ``?q=`` in it, not run); POST: run the form's query (``format=csv``: download
    it; ``cell=<key>``: show one value whole)."""
    if request.method == "GET":
        return _sql_page(request, request.query_params.get("q", ""))
    form = await _form(request)
    if isinstance(form, Response):
        return form
    query = form.get("q", "").strip()
    if not query:
        return _sql_page(request, "")
    if form.get("format") == "csv":
        return await _download(request, query)
    if "cell" in form:
        return await _show_all(request, query, form["cell"])
    collection = request.app.state.source.collection()
    shown = await _running(request, query, lambda cancel: sql_cells.first_rows(collection, query, cancel))
    return shown if isinstance(shown, Response) else _sql_page(request, query, result=shown)


async def _running(request: Request, query: str, work: Callable[[Cancel], T]) -> T | Response:
    """``work(cancel)`` in a thread, stopped if the client goes away; its error: the page saying it."""
    cancel = Cancel()
    started = time.monotonic()
    try:
        return await _unless_gone(request, cancel, lambda: run_in_threadpool(work, cancel))
    except QueryCancelledError:
        _note_gone(query, started)
        return Response(status_code=499)  # (nobody reads it)
    except ProjectError as err:
        return _sql_page(request, query, error=str(err))


async def _show_all(request: Request, query: str, key: str) -> Response:
    """The page with one value of the query's result whole (within FULL_CHARS): the cell ``key`` names."""
    try:
        row, column, length, shown = key.split(":")
        row, column, length = int(row), int(column), int(length)
    except ValueError:
        return _sql_page(request, query, error=f"{key!r} names no cell of a result (row:column:length:digest)")
    collection = request.app.state.source.collection()
    whole = await _running(request, query, lambda cancel: sql_cells.one_cell(collection, query, row, column, cancel))
    if isinstance(whole, Response):
        return whole
    if whole is None or (whole.length, sql_cells.digest(whole.text)) != (length, shown):
        error = (
            f"row {row + 1}, column {column + 1} of the query's result is not the value shown before (the query was "
            "edited, or it gave its rows in another order: ORDER BY keeps one) - Run it again"
        )
        return _sql_page(request, query, error=error)
    return _sql_page(request, query, whole=whole)


def _sql_page(request: Request, query: str, error: str | None = None, **shown: Any) -> HTMLResponse:
    return page(
        request,
        "sql.html",
        status=400 if error else 200,
        query=query,
        error=error,
        result=shown.get("result"),
        whole=shown.get("whole"),
        shown=SHOWN_ROWS,
        limits={"cell": CELL_CHARS, "page": PAGE_CHARS, "full": FULL_CHARS, "columns": SHOWN_COLUMNS},
        views=list(read_views().values()),
    )


async def _form(request: Request) -> dict[str, str] | Response:
    """The fields of a form POSTed (URL-encoded, UTF-8, at most FORM_BYTES), or the page refusing it."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return problem(request, f"the SQL page takes a form (application/x-www-form-urlencoded), not {kind!r}", 415)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return problem(request, f"the query is longer than {FORM_BYTES:,} bytes", 413)
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        return problem(request, "the form is not UTF-8 text", 400)
    return {k: v[-1] for k, v in fields.items()}


async def _unless_gone(request: Request, cancel: Cancel, work: Callable[[], Awaitable[T]]) -> T:
    """``await work()``; if the client goes away meanwhile, ``cancel`` (its query is interrupted)."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel()

    failed: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            done = await work()
        except Exception as err:  # raised below, as itself (not in a group)
            failed = err
        group.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return done


def _note_gone(query: str, started: float) -> None:
    """The server's log: a client went away, and its query was stopped."""
    shown = " ".join(query.split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    _note(f"a client went away: its query was stopped after {time.monotonic() - started:.1f} s ({shown})")


def _note(message: str) -> None:
    print(f"serve: {message}", file=sys.stderr, flush=True)


class _Chunks:
    """A download's chunks, made by a thread of their own at most CSV_AHEAD ahead of the client.

    ``stop`` (the client went away, or the download ended) cancels the query; the thread
    then ends, closing the query's result.
    """

    def __init__(self, chunks: Iterator[str], cancel: Cancel, query: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | None | BaseException] = asyncio.Queue()
        self._room = threading.Semaphore(CSV_AHEAD)
        self._cancel = cancel
        self._query = query
        threading.Thread(target=self._work, args=(chunks,), name="sql-csv", daemon=True).start()

    def _put(self, item: str | None | BaseException) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _work(self, chunks: Iterator[str]) -> None:
        started = time.monotonic()
        try:
            for chunk in chunks:
                self._room.acquire()
                if self._cancel.is_set:
                    return
                self._put(chunk)
            self._put(None)
        except QueryCancelledError as err:
            _note_gone(self._query, started)
            self._put(err)
        except Exception as err:  # the download says what stopped it
            self._put(err)
        finally:
            chunks.close()  # (the query's result, if the loop left it open)

    async def next(self) -> str | None:
        """The next chunk, None at the end; the error that stopped the query (ProjectError: a limit)."""
        item = await self._queue.get()
        self._room.release()
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        self._cancel()
        self._room.release()  # (a thread waiting for room sees the cancel)


class _Download(StreamingResponse):
    """A streamed download that a failure midway leaves unfinished: the client sees it fail, not a short file."""

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
        except ProjectError as err:
            _note(f"a CSV download stopped unfinished: {err}")
            return  # no last chunk: the connection is closed
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _download(request: Request, query: str) -> Response:
    """Every row of the query as CSV (as ``sql --csv`` writes it), streamed; an error before the first row: the page."""
    source: data.Source = request.app.state.source
    cancel = Cancel()

    def csv_text() -> Iterator[str]:
        checked = check_query(query)
        with source.collection().result(checked, cancel=cancel) as result:
            yield from csv_chunks(result.columns, result.batches(CSV_BATCH_ROWS))

    chunks = _Chunks(csv_text(), cancel, query)
    try:
        first = await _unless_gone(request, cancel, chunks.next)
    except QueryCancelledError:
        return Response(status_code=499)
    except ProjectError as err:
        chunks.stop()
        return _sql_page(request, query, error=str(err))

    async def body():
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await chunks.next()
        finally:
            chunks.stop()

    headers = {**HEADERS, "Content-Disposition": 'attachment; filename="query.csv"'}
    return _Download(body(), media_type="text/csv; charset=utf-8", headers=headers)
