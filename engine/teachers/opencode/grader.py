"""CORAL's grader on a root's own code, before the first turn, as a turn's eval is graded (``check_grader``).

The root's commit gets a throwaway edge layout (``<tree>/grader-check``: a worktree at it, a copy
of the root's shared dir, the edge's CORAL run) and a pending attempt (``CoralLayout.submit_root``);
CORAL's grader daemon then runs as it runs beside a turn, until it has graded the attempt or the
turn timeout passed, and is stopped. The layout is removed; what the daemon printed is in the fact
(:class:`~ingest.events.GraderChecked`), whose score the engine holds against the root's recorded one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from engine.teachers.opencode.coral import CoralLayout
from engine.teachers.opencode.options import OpenCodeOptions
from engine.teachers.opencode.processes import Companion, Finished, Supervisor
from engine.teachers.opencode.worktrees import Worktrees, copy_dir
from engine.teachers.protocol import RootInfo
from ingest import coral_eval
from ingest.events import GraderChecked

GRADER_LOG_LIMIT = 64 * 1024


def grade_root(
    root: RootInfo,
    start: dict[str, Any],
    *,
    coral: CoralLayout,
    worktrees: Worktrees,
    processes: Supervisor,
    env: dict[str, str],
    opts: OpenCodeOptions,
) -> GraderChecked:
    """Grade the root's own code unchanged (``start``: its state) with CORAL's grader, in ``env``."""
    repo, commit = Path(start["repo"]), start["commit"]
    edge_dir = worktrees.edge_dir(root.tree_id, "grader-check")
    worktree, t0 = edge_dir / "wt", time.monotonic()
    shared = worktree / opts.shared_dir
    worktrees.prepare(repo, worktree, commit, fresh=True)
    try:
        copy_dir(Path(start["shared"]) if start.get("shared") else None, shared)
        layout = coral.prepare(edge_dir, worktree, shared, 0)
        attempt = coral.submit_root(shared, commit)
        daemon = coral.daemon(layout, env, edge_dir / "grader-check.log")
        finished, output = _grade(
            attempt, daemon, edge_dir, root.tree_id, processes=processes, env=env, timeout_s=opts.turn_timeout_s
        )
        result = coral_eval.from_attempt(attempt)
        if result is None or result.status == "pending":
            why = (
                f"the grader did not grade the root within {opts.turn_timeout_s:.0f} s"
                if finished.outcome == "timeout"
                else f"CORAL's grader daemon exited with {finished.returncode} before grading the root"
            )
            result = coral_eval.EvalResult(None, "timeout" if finished.outcome == "timeout" else "crashed", why, "none")
    finally:
        coral.finish(edge_dir, worktree, shared, 0)
        worktrees.discard(repo, worktree)
    return GraderChecked(
        tree_id=root.tree_id,
        commit_hash=commit,
        score=result.score,
        recorded_score=root.score,
        eval_status=result.status,
        error=result.error,
        wall_seconds=round(time.monotonic() - t0, 3),
        feedback=result.feedback,
        grader_log=output,
    )


def _grade(
    attempt: Path,
    daemon: Companion,
    edge_dir: Path,
    tree_id: str,
    *,
    processes: Supervisor,
    env: dict,
    timeout_s: float,
) -> tuple[Finished, str]:
    """Run the grader daemon until ``attempt`` is no longer pending (or the deadline); its output."""
    graded = threading.Event()

    def watch() -> None:  # the daemon never exits by itself: it is stopped once it has graded
        while not graded.wait(0.2):
            found = coral_eval.from_attempt(attempt)
            if found is not None and found.status != "pending":
                graded.set()

    lines: list[str] = []
    stdin = edge_dir / "grader-check.stdin"
    stdin.write_text("")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        finished = processes.run(
            daemon.args,
            label=f"{tree_id}#grader-check",
            cwd=daemon.cwd,
            env=daemon.env or env,
            stdin=stdin,
            stderr=daemon.output,
            on_line=lines.append,
            timeout_s=timeout_s,
            cancel=graded,
        )
    finally:
        graded.set()
        watcher.join(timeout=10)
    return finished, "".join(lines) + grader_output(daemon.output)


def grader_output(path: Path) -> str:
    """What the grader daemon printed (a turn's, or a root's check), its last 64 KiB when longer (all of it stays
    on disk)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if len(data) > GRADER_LOG_LIMIT:
        data = b"[... earlier output in " + str(path).encode() + b"]\n" + data[-GRADER_LOG_LIMIT:]
    return data.decode("utf-8", "replace")
