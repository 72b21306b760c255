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

A backend that can grade a root's own code with the task's grader offers
``check_grader(root, root_state)``, returning a ``GraderChecked`` fact (or None when
it does not check); the engine calls it before the first turn (``opencode`` with
``--coral-dir``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ingest.errors import InputError, ProjectError
from ingest.events import Event

BACKENDS = ("sim", "opencode")


class TurnCancelled(ProjectError):
    """A turn was interrupted before it finished; nothing of it is recorded."""


@dataclass(frozen=True)
class RootInfo:
    """What a backend needs to know about a tree's root snapshot."""

    tree_id: str
    path: str
    score: float | None
    commit_hash: str | None


@dataclass(frozen=True)
class TurnRequest:
    """One rollout turn to run.

    ``start_state`` is the checkpoint to start from: for turn 1 the parent node's
    final state (the root's own state for layer 1), for turn 2 turn 1's end state.
    ``fork`` is true for turn 1: the backend copies code, shared knowledge and
    session (a fresh session from a root) instead of continuing them.
    """

    tree_id: str
    edge_id: str
    parent_id: str
    turn: int
    slot: int
    attempt: int
    start_state: dict[str, Any]
    fork: bool
    direction: str
    timeout_s: float | None = None


class Teacher(Protocol):
    """A Teacher backend."""

    name: str

    def root_state(self, root: RootInfo) -> dict[str, Any]:
        """The checkpoint of a tree's root (code and shared state of the snapshot)."""
        ...

    def run_turn(self, request: TurnRequest, cancel: threading.Event) -> list[Event]:
        """Run one turn; return its facts ending with EvalFinished and TurnFinished."""
        ...

    def discard(self, state: dict[str, Any]) -> None:
        """Release what a checkpoint holds (e.g. the worktree of a pruned edge)."""
        ...

    def close(self) -> None:
        """Release everything the backend holds."""
        ...


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
