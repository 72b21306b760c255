"""The turn pool: Teacher turns running in ``slots`` worker threads, turn 2s first.

The pool knows only what is submitted and not yet handed back; what each edge needs
next is the log's (the view ``int_edges__open``). Submitted turns wait in a queue
until a slot is free: a turn 2 (its edge holds a place already) before a turn 1,
each in submission order. A finished turn's facts are checked (they end with an
``EvalFinished`` and a ``TurnFinished``) and, in ``rounds`` mode, kept in the spool
until the log holds them.

Where a turn runs is the ``runner``'s business: by default the Teacher's
``run_turn`` on the slot's thread; the Ray executor (``engine.mcts.cluster``) runs it
on a worker of a cluster while the slot's thread waits for it.
"""

from __future__ import annotations

import hashlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future

from engine.mcts.spool import Spool
from engine.teachers import Teacher, TurnCancelled, TurnRequest
from ingest.errors import ProjectError
from ingest.events import EvalFinished, Event, TurnFinished, canonical_json


class TeacherFailedError(ProjectError):
    """The Teacher backend failed in a way the engine cannot record as a turn."""


Finished = tuple[TurnRequest, list[Event]]
Runner = Callable[[TurnRequest, threading.Event], list[Event]]
_STOP = (0, -1, None, None)  # sorts after every turn: a slot's thread ends
# The engine's thread waits in slices: a signal the kernel hands to another thread only
# sets a flag, and Python runs its handler in the main thread when that thread next runs
# Python code, so a wait without an end would hold off SIGTERM until a turn finished.
WAIT_SLICE_S = 0.2


def start_key(request: TurnRequest) -> str:
    """The digest of where a turn starts: its edge's parent, the turn, and the state it forks or continues."""
    body = {"parent": request.parent_id, "turn": request.turn, "fork": request.fork, "start": request.start_state}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()[:32]


def moving_average(average: float | None, value: float, weight: float = 0.1) -> float:
    """An exponential moving average (the first value starts it)."""
    return value if average is None else (1 - weight) * average + weight * value


class TurnPool:
    """Runs turns concurrently in ``slots`` threads; ``spool`` (rounds mode) keeps finished ones on disk."""

    def __init__(self, teacher: Teacher, slots: int, spool: Spool | None = None, runner: Runner | None = None) -> None:
        self.teacher = teacher
        self.spool = spool
        self.runner = runner or teacher.run_turn
        self.cancel = threading.Event()
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._finished: queue.Queue[tuple[TurnRequest, Future]] = queue.Queue()
        self.running: dict[tuple[str, int], TurnRequest] = {}  # submitted, not yet handed back
        self.slots = slots
        self.turn_seconds: float | None = None  # a moving average of the turns' run times
        self._threads: list[threading.Thread] = []  # started with the first turn

    def submit(self, request: TurnRequest) -> None:
        """Queue a turn; :meth:`wait` hands back its facts."""
        self.running[(request.edge_id, request.turn)] = request
        future = self._enqueue(request)
        future.add_done_callback(lambda f: self._finished.put((request, f)))

    def wait(self) -> list[Finished]:
        """Every turn finished so far, in the order they finished (at least one: blocks)."""
        while True:
            try:
                done = [self._finished.get(timeout=WAIT_SLICE_S)]
                break
            except queue.Empty:
                continue
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
            spooled = (
                self.spool.take(request.edge_id, request.turn, start_key(request), request.tree_id)
                if self.spool
                else None
            )
            pending.append(spooled if spooled is not None else self._enqueue(request))
        for item in pending:
            yield item if isinstance(item, list) else self._result(item)

    def _enqueue(self, request: TurnRequest) -> Future:
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._slot, name=f"teacher-{i}", daemon=True) for i in range(self.slots)
            ]
            for thread in self._threads:
                thread.start()
        future: Future = Future()
        self._queue.put((-request.turn, next(self._order), request, future))
        return future

    def _slot(self) -> None:
        while True:
            _, _, request, future = self._queue.get()
            if request is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._run(request))
            except BaseException as err:  # handed to whoever waits for the turn
                future.set_exception(err)

    def _run(self, request: TurnRequest) -> list[Event]:
        start = time.monotonic()
        facts = self.runner(request, self.cancel)
        self.turn_seconds = moving_average(self.turn_seconds, time.monotonic() - start)
        where = f"{request.edge_id} turn {request.turn}"
        if not facts or not isinstance(facts[-1], TurnFinished):
            raise TeacherFailedError(f"{where}: the backend returned no TurnFinished")
        if not any(isinstance(f, EvalFinished) for f in facts):
            raise TeacherFailedError(f"{where}: the backend returned no EvalFinished")
        if self.spool is not None and facts[-1].outcome != "error":
            # A turn that failed with a backend error is not kept: if the run stops
            # on a streak of them, resume runs it again (see Explorer).
            self.spool.put(request.edge_id, request.turn, facts, start_key(request))
        return facts

    def _result(self, future: Future) -> list[Event]:
        try:
            while not future.done():
                futures.wait([future], timeout=WAIT_SLICE_S)
            return future.result()
        except (TurnCancelled, ProjectError):
            raise
        except Exception as err:
            raise TeacherFailedError(f"the {self.teacher.name} backend failed: {err!r}") from err

    def close(self, cancel: bool = False) -> None:
        """Wait for the slots' threads; with ``cancel``, stop the turns in flight and drop the queued ones."""
        if cancel:
            self.cancel.set()
            while True:
                try:
                    _, _, _, future = self._queue.get_nowait()
                except queue.Empty:
                    break
                if future is not None:
                    future.cancel()
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            while thread.is_alive():
                thread.join(WAIT_SLICE_S)
