"""Teacher backends: fork a node's state and run one rollout turn (``sim``, ``opencode``).

A backend runs turns on worker threads. ``run_turn`` returns the raw facts of the
turn (tool calls, steps, message parts, skipped stream lines) followed by one
``EvalFinished`` and one ``TurnFinished``; the engine appends them to the log
together. ``TurnFinished.state`` is the checkpoint the next turn or a child edge
forks from (a session id, a commit, a shared-dir copy...): it is recorded in the
log, so a resumed run can fork from any recorded node.

Real backends take minutes per turn: they must honour ``request.timeout_s`` (the
turn then ends with outcome ``timeout`` and a failed eval) and ``cancel`` (stop
promptly, leave no process behind, and return or raise ``TurnCancelled``). A turn
whose Teacher process itself failed ends with outcome ``error``.

A backend whose turns take memory outside this process has a config option for it
per concurrent turn (``turn_memory_mb``); ``check_memory`` refuses more slots on this
machine than its memory carries, before a run starts its turns here.

A backend that can grade a root's own code with the task's grader offers
``check_grader(root, root_state)``, returning a ``GraderChecked`` fact (or None when
it does not check); the engine calls it before the first turn (``opencode`` with
``--coral-dir``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.teachers.protocol import RootInfo, Teacher, TurnCancelled, TurnRequest
from ingest.errors import InputError

__all__ = [
    "RootInfo",
    "Teacher",
    "TurnCancelled",
    "TurnRequest",
    "check_memory",
    "make_teacher",
    "memory_available_mb",
    "turn_memory_mb",
]

BACKENDS = ("sim", "opencode")


def memory_available_mb() -> int | None:
    """The memory this machine still gives its processes, in MB: ``MemAvailable``, or less
    under a cgroup (v2) limit; None when neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) // 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(max(int(limit) - used, 0) // (1 << 20))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def turn_memory_mb(config: Any) -> int:
    """The memory one concurrent turn of ``config``'s backend takes outside this process (0 for ``sim``)."""
    if config.backend != "opencode":
        return 0
    found = config.backend_options.get("turn_memory_mb")  # None: the measured cost of how turns run
    if isinstance(found, int):
        return found
    return SERVED_TURN_MB if config.backend_options.get("serve", True) else PROCESS_TURN_MB


# A concurrent turn's memory, measured (benchmarks/teacher.py): a served turn's instance in its
# server with its tools (130-290 MB), a 16th of the server's ~250 MB base, CORAL's grader daemon;
# an ``opencode run`` process and its tools took 515-777 MB.
SERVED_TURN_MB = 300
PROCESS_TURN_MB = 800


def check_memory(per_turn: int, parallel: int) -> None:
    """Refuse ``parallel`` concurrent turns of ``per_turn`` MB each on this machine beyond what its memory carries.

    Without it a wide run is cut by the OOM killer, which takes the turns in flight
    (and maybe the writer) at a moment nobody chose.
    """
    available = memory_available_mb() if per_turn else None
    if available is None or parallel * per_turn <= available:
        return
    fits = available // per_turn
    advice = (
        f"use --parallel {fits} or fewer" if fits else "not even one turn fits: free memory first"
    ) + ", or spread the turns over a cluster (--executor ray)"
    raise InputError(
        f"--parallel {parallel}: {parallel} concurrent turns need about {parallel * per_turn:,} MB "
        f"({per_turn:,} MB each, backend_options.turn_memory_mb) and this machine has {available:,} MB "
        f"available: {advice}"
    )


def make_teacher(config: Any, run_dir: Path, node: str | None = None) -> Teacher:
    """The Teacher backend a run config names (``config``: an engine.config.RunConfig).

    ``node``: the Teacher runs turns on that node of a cluster, beside the run's
    writer and other nodes' Teachers (see ``engine.mcts.cluster``).
    """
    if config.backend == "sim":
        from engine.teachers.sim import SimTeacher

        return SimTeacher(config.seed, config.backend_options)
    if config.backend == "opencode":
        from engine.teachers.opencode import OpenCodeTeacher

        return OpenCodeTeacher(config, run_dir, node)
    raise InputError(f"unknown backend {config.backend!r} (use {' or '.join(BACKENDS)})")
