"""What the engine and a Teacher backend exchange: a turn to run, a root, the backend's protocol.

The package's docstring (``engine/teachers/__init__.py``) says what a backend must do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ingest.errors import ProjectError
from ingest.events import Event


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
    """A Teacher backend; ``version`` names its runtime and version (recorded when a run starts or resumes)."""

    name: str
    version: str

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
