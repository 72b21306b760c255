"""Server-sent events of a run being written: ``watch``'s frames, pushed as parts land.

The stream waits for the run's first part if the run has none yet (watching the data
directory), then follows it with :func:`engine.watch.follow` - the file watching
``watch`` does, through the server's reader - in a thread: each frame whose log prefix is new becomes an event
``frame`` (the page then fetches the part of itself that follows the run), the
finished run an event ``end``, a writer that died an event ``problem``. The stream
stops following once the page goes away.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import watchfiles
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from engine.runset import Reader
from engine.watch import follow
from engine.web.pages import bad_name
from ingest.errors import ProjectError
from ingest.log import EventLog

PERIOD_S = 5.0  # seconds between looks when no part is noticed (as watch's default)


def _event(kind: str, body: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(body, default=str)}\n\n"


async def _frames(run_id: str, reader: Reader) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
    stop = threading.Event()

    def put(kind: str, body: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (kind, body))

    def work() -> None:
        last = None
        try:
            for frame in follow(reader, run_id, PERIOD_S, stop):
                if stop.is_set():
                    return
                if frame.finished:
                    put("end", {"seq": frame.seq})
                    return
                if frame.seq != last:
                    put("frame", {"seq": frame.seq, "progress": frame.progress})
                    last = frame.seq
                else:
                    put("alive", {})
        except ProjectError as err:
            put("problem", {"message": str(err)})
        except Exception as err:  # the page says what ended the stream
            put("problem", {"message": f"following the run stopped: {err}"})

    data_dir = reader.data_dir
    log = EventLog(data_dir, run_id)
    try:
        if not log.exists():  # wait for the run's first part
            yield ": waiting for the run\n\n"
            # (A page gone cancels this generator: the look in progress ends within its timeout.)
            async for _changes in watchfiles.awatch(data_dir, rust_timeout=2000, yield_on_timeout=True):
                if log.exists():
                    break
                yield ": waiting\n\n"
            else:
                return
        thread = threading.Thread(target=work, name=f"follow-{run_id}", daemon=True)
        thread.start()
        while True:
            try:
                kind, body = await asyncio.wait_for(queue.get(), 15)
            except TimeoutError:
                yield ": alive\n\n"  # a comment: a page gone is noticed when writing fails
                continue
            if kind == "alive":
                yield ": alive\n\n"
                continue
            yield _event(kind, body)
            if kind in ("end", "problem"):
                return
    finally:
        stop.set()


async def run_events(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    if (why := bad_name(run_id, "run")) is not None:
        return PlainTextResponse(why + "\n", 404)
    source = request.app.state.source
    return StreamingResponse(
        _frames(run_id, source.reader),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
