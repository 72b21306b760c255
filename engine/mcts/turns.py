"""The turn pool: Teacher turns running on worker threads, one per Teacher slot.

The pool knows only what is running; what each edge needs next is the log's
(the view ``int_edges__open``). A finished turn's facts are checked (they end with
an ``EvalFinished`` and a ``TurnFinished``) and, in ``rounds`` mode, kept in the
spool until the log holds them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from engine.mcts.spool import Spool
from engine.teachers import Teacher, TurnCancelled, TurnRequest
from ingest.errors import ProjectError
from ingest.events import EvalFinished, Event, TurnFinished


class TeacherFailedError(ProjectError):
    """The Teacher backend failed in a way the engine cannot record as a turn."""


Finished = tuple[TurnRequest, list[Event]]


class TurnPool:
    """Runs turns concurrently; ``spool`` (rounds mode) keeps finished ones on disk."""

    def __init__(self, teacher: Teacher, slots: int, spool: Spool | None = None) -> None:
        self.teacher = teacher
        self.spool = spool
        self.cancel = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="teacher")
        self._finished: queue.Queue[tuple[TurnRequest, Future]] = queue.Queue()
        self.running: dict[tuple[str, int], TurnRequest] = {}

    def submit(self, request: TurnRequest) -> None:
        """Start a turn; :meth:`wait` hands back its facts."""
        self.running[(request.edge_id, request.turn)] = request
        future = self._executor.submit(self._run, request)
        future.add_done_callback(lambda f: self._finished.put((request, f)))

    def wait(self) -> list[Finished]:
        """Every turn finished so far, in the order they finished (at least one: blocks)."""
        done = [self._finished.get()]
        while True:
            try:
                done.append(self._finished.get_nowait())
            except queue.Empty:
                break
        out = []
        for request, future in done:
            del self.running[(request.edge_id, request.turn)]
            out.append((request, self._result(future)))
        return out

    def gather(self, requests: list[TurnRequest]) -> Iterator[list[Event]]:
        """Run these turns concurrently (spooled ones are not run again); yield facts in their order.

        A failure is raised when its turn's facts are due, after those before it.
        """
        pending: list[list[Event] | Future] = []
        for request in requests:
            spooled = self.spool.take(request.edge_id, request.turn) if self.spool else None
            pending.append(spooled if spooled is not None else self._executor.submit(self._run, request))
        for item in pending:
            yield item if isinstance(item, list) else self._result(item)

    def _run(self, request: TurnRequest) -> list[Event]:
        facts = self.teacher.run_turn(request, self.cancel)
        where = f"{request.edge_id} turn {request.turn}"
        if not facts or not isinstance(facts[-1], TurnFinished):
            raise TeacherFailedError(f"{where}: the backend returned no TurnFinished")
        if not any(isinstance(f, EvalFinished) for f in facts):
            raise TeacherFailedError(f"{where}: the backend returned no EvalFinished")
        if self.spool is not None and facts[-1].outcome != "error":
            # A turn that failed with a backend error is not kept: if the run stops
            # on a streak of them, resume runs it again (see Explorer).
            self.spool.put(request.edge_id, request.turn, facts)
        return facts

    def _result(self, future: Future) -> list[Event]:
        try:
            return future.result()
        except (TurnCancelled, ProjectError):
            raise
        except Exception as err:
            raise TeacherFailedError(f"the {self.teacher.name} backend failed: {err!r}") from err

    def close(self, cancel: bool = False) -> None:
        """Wait for the workers; with ``cancel``, stop the turns in flight first."""
        if cancel:
            self.cancel.set()
        self._executor.shutdown(wait=True, cancel_futures=cancel)
