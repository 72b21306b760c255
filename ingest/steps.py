"""Steps that a signal must not cut in two, such as publishing a part and recording it.

The command line turns SIGINT, SIGTERM and SIGHUP into an exception raised in the
main thread wherever it is. Inside :func:`uninterruptible` (on the main thread) the
handler instead hands its work to :func:`defer`, and it runs when the outermost such
step ends: the step completes, then the command unwinds as it would have. A kill -9
cannot be deferred; the log's record makes each step recoverable from it instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_depth = 0
_deferred: list[Callable[[], None]] = []


@contextmanager
def uninterruptible() -> Iterator[None]:
    """Run a block that a signal's exception must not interrupt (only the main thread's blocks)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _deferred:
            fire = _deferred[0]
            _deferred.clear()
            fire()


def defer(fire: Callable[[], None]) -> bool:
    """From a signal handler: keep ``fire`` for the end of the step in progress (False: no step is)."""
    if _depth == 0:
        return False
    _deferred.append(fire)
    return True
