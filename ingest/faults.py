"""Named moments at which a test can kill this process with SIGKILL (the kill -9 soak).

Nothing happens unless ``TEACHER_MCTS_CRASH_AT=<point>:<n>`` is set: the process
then kills itself (``kill -9``: no handler, no cleanup) the n-th time it reaches
``<point>``. The points are the moments between two steps of a write, where a
kill from outside would have to land by luck:

    publish.written    a part's temp file is written and fsynced, not yet recorded
    publish.recorded   a part is committed in the run's record, its file not yet renamed
    publish.renamed    a part is renamed into place, its directory not yet fsynced
    compact.published  a merged part is published; the parts it replaces are all still there
    compact.removing   the first of the parts a merge replaces is removed, the others not
    spool.written      a finished turn's spool file is written under its temp name
    spool.renamed      a finished turn is in the spool, not yet in the log
    edge.started       the engine staged an edge start, in the middle of a fill
    campaign.decided   a campaign's round is in its log, its grants not yet in the runs'
    derived.written    a file of derived state is written under its temporary name (not fsynced), not yet renamed
    derived.built      a derived state's temporary directory is complete, not yet renamed into place

``<point>:<n>:<SIGNAL>`` (SIGHUP, SIGTERM, SIGINT) sends that signal instead, so a
test can interrupt a step exactly where a signal from outside lands by luck.

Each point counts how often it is reached (:func:`reached`), so a test can run a
job once without the variable and then pick a moment of each kind within it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from ingest.errors import InputError

CRASH_ENV = "TEACHER_MCTS_CRASH_AT"
POINTS = (
    "publish.written",
    "publish.recorded",
    "publish.renamed",
    "compact.published",
    "compact.removing",
    "spool.written",
    "spool.renamed",
    "edge.started",
)
CAMPAIGN_POINTS = ("campaign.decided",)  # reached by a campaign only (the soak kills explore runs)
DERIVED_POINTS = ("derived.written", "derived.built")  # reached by readers storing derived state
SIGNALS = {"SIGHUP": signal.SIGHUP, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}

_reached: Counter[str] = Counter()
_lock = threading.Lock()


def _plan() -> tuple[str, int, int] | None:
    """The point, count and signal ``$TEACHER_MCTS_CRASH_AT`` names (InputError when malformed)."""
    value = os.environ.get(CRASH_ENV)
    if not value:
        return None
    point, _, count = value.partition(":")
    count, _, name = count.partition(":")
    points = POINTS + CAMPAIGN_POINTS + DERIVED_POINTS
    if point not in points or not count.isdigit() or int(count) < 1 or (name and name not in SIGNALS):
        msg = (
            f"${CRASH_ENV}={value!r}: expected <point>:<n>[:<signal>] with n >= 1, a point among "
            f"{', '.join(points)} and a signal among {', '.join(SIGNALS)}"
        )
        raise InputError(msg)
    return point, int(count), SIGNALS[name] if name else signal.SIGKILL


def crash_point(point: str) -> None:
    """Count one arrival at ``point``; SIGKILL (or signal) this process if it is the planned one."""
    with _lock:
        _reached[point] += 1
        arrival = _reached[point]
    plan = _plan()
    if plan is not None and plan[:2] == (point, arrival):
        os.kill(os.getpid(), plan[2])


def reached() -> dict[str, int]:
    """How often each point was reached in this process so far."""
    with _lock:
        return dict(_reached)
