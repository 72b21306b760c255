"""A CORAL run of its own for every edge, so that the real ``coral eval`` grades inside our worktrees.

CORAL's ``coral eval`` finds its run only through the breadcrumb ``.coral_dir`` in
its working directory. It commits there, checkpoints the run's ``public/`` and
leaves a ``pending`` attempt, which a grader daemon grades in a checkout of
``<coral_dir>/../repo``. With ``--coral-dir`` (the Student run's ``.coral``) every
edge gets that layout beside its worktree::

    <edge>/.coral/config.yaml     a copy of the Student run's
    <edge>/.coral/private/        links to this run's copy of the Student's private/
                                  (the grader), and a grader_checkouts/ of its own
    <edge>/.coral/public   ->  <edge>/wt/.opencode   (the edge's copy of the shared dir)
    <edge>/repo            ->  <edge>/wt
    <edge>/wt/.coral_dir, <edge>/wt/.coral_agent_id  (the breadcrumbs, never committed)

and CORAL's grader daemon runs beside the turn's OpenCode process, stopped with it.
The attempt lands in ``.opencode/attempts/<commit>.json``, where the backend reads
the eval result. The Student run is only ever read: its ``private/`` is copied once
per run, and the daemon runs without writing bytecode next to the grader's sources.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from engine.teachers.opencode.processes import Companion
from ingest.errors import InputError
from ingest.paths import TMP_MARK, write_atomically

# How the backend starts CORAL's grader daemon: CORAL has no command for it (its
# `coral start` runs it in-process), so its Python runs it with logging on stderr.
DAEMON_SCRIPT = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s %(levelname)s: %(message)s')\n"
    "from coral.grader.daemon import run_daemon\n"
    "run_daemon(sys.argv[1])\n"
)
# pip's first lines of a console script whose interpreter path is too long for "#!".
TRAMPOLINE = re.compile(r"^'''exec' \"([^\"]+)\"")


def student_coral_dir(path: str | Path) -> Path:
    """The Student run's ``.coral`` (``path`` itself, or ``path/.coral``), absolute and checked."""
    given = Path(path).expanduser().resolve()
    coral = given / ".coral" if (given / ".coral" / "config.yaml").is_file() else given
    if not coral.is_dir():
        raise InputError(f"--coral-dir {path}: no such directory")
    missing = [
        name
        for name, ok in (("config.yaml", (coral / "config.yaml").is_file()), ("private/", (coral / "private").is_dir()))
        if not ok
    ]
    if missing:
        raise InputError(f"--coral-dir {coral}: not a CORAL run's .coral directory (no {' or '.join(missing)})")
    return coral


def coral_python(eval_command: str, configured: str | None, search_path: str | None = None) -> str:
    """The Python CORAL is installed in: ``configured``, else the one the eval command's script names.

    A console script installed by pip or uv names its interpreter in its first
    line (``#!/venv/bin/python``, ``#!/usr/bin/env python3``, or pip's ``/bin/sh``
    trampoline for long paths). Commands are looked up in ``search_path`` (default
    ``$PATH``).
    """
    if configured:
        found = shutil.which(configured, path=search_path) if "/" not in configured else configured
        if not found or not os.access(found, os.X_OK):
            raise InputError(f"backend_options.coral_python {configured!r} is not an executable")
        return str(Path(found).absolute())
    word = eval_command.split()[0]
    script = shutil.which(word, path=search_path) if "/" not in word else word
    problem = "is not on PATH" if script is None else None
    python = None if script is None else _script_interpreter(Path(script), search_path)
    if python is None:
        problem = problem or f"({script}) does not name its Python in its first line"
        raise InputError(
            f"cannot tell which Python CORAL is installed in: {word!r} {problem} - set backend_options.coral_python"
        )
    return python


def _script_interpreter(script: Path, search_path: str | None) -> str | None:
    try:
        with open(script, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    trampoline = TRAMPOLINE.match(head[1]) if len(head) > 1 else None
    if words and Path(words[0]).name == "sh" and trampoline:
        words = [trampoline[1]]
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words:
        return None
    found = shutil.which(words[0], path=search_path) if "/" not in words[0] else words[0]
    return str(Path(found).absolute()) if found else None


def check_daemon(python: str, env: dict[str, str]) -> None:
    """Refuse a run whose CORAL has no grader daemon to start (before anything runs)."""
    done = subprocess.run(
        [python, "-c", "import coral.grader.daemon"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError(
            f"{python} cannot import CORAL's grader daemon (coral.grader.daemon: {detail[0]}) - "
            "install CORAL there or set backend_options.coral_python"
        )


class CoralLayout:
    """The per-edge CORAL runs of one exploration, made from the Student run's ``.coral``."""

    def __init__(self, student: Path, run_dir: Path, python: str, agent_id: str) -> None:
        self.student = student
        self.python = python
        self.agent_id = agent_id
        self.private = self._copy_private(student / "private", Path(run_dir) / "coral" / "private")

    @staticmethod
    def _copy_private(src: Path, dest: Path) -> Path:
        """This run's copy of the Student's ``private/`` (once; the grader may write beside itself)."""
        if not dest.is_dir():
            tmp = dest.with_name(f"{dest.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)

            def checkouts(folder: str, _names: list[str]) -> list[str]:  # the Student's own grader checkouts
                return ["grader_checkouts"] if Path(folder) == src else []

            try:
                shutil.copytree(src, tmp, symlinks=True, ignore=checkouts)
            except OSError as err:
                shutil.rmtree(tmp, ignore_errors=True)
                raise InputError(f"{src}: cannot copy the grader's private directory ({err})") from err
            os.rename(tmp, dest)
        return dest

    def prepare(self, edge_dir: Path, worktree: Path, shared: Path, turn: int) -> Path:
        """Build the edge's CORAL run around ``worktree``; returns its ``.coral``.

        Pending attempts in the copied shared dir are held aside for the turn: the
        daemon would grade them (their commits are not in this repository, or are an
        earlier turn's), and one of the Teacher's own would block its eval.
        """
        coral = edge_dir / ".coral"
        self._clear_checkouts(coral, worktree)
        coral.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.student / "config.yaml", coral / "config.yaml")
        private = coral / "private"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir()
        for entry in sorted(self.private.iterdir()):
            (private / entry.name).symlink_to(entry)
        (private / "grader_checkouts").mkdir(exist_ok=True)
        _link(coral / "public", shared)
        _link(edge_dir / "repo", worktree)
        (worktree / ".coral_dir").write_text(str(coral))
        (worktree / ".coral_agent_id").write_text(self.agent_id)
        held = edge_dir / f"held-t{turn}"
        shutil.rmtree(held, ignore_errors=True)
        for path in _pending_attempts(shared / "attempts"):
            held.mkdir(exist_ok=True)
            os.replace(path, held / path.name)
        return coral

    def submit_root(self, shared: Path, commit: str) -> Path:
        """A pending attempt of ``commit`` in the edge's shared dir, as ``coral eval`` writes one.

        ``coral eval`` refuses a tree with no change (it finds nothing to commit), so
        the grader check (OpenCodeTeacher.check_grader) hands the grader daemon the
        root's own commit this way: the daemon grades it in a checkout of the edge's
        repository with the task's grader, as it grades every turn's commit.
        """
        attempt = {
            "commit_hash": commit,
            "agent_id": self.agent_id,
            "title": "teacher-mcts: grader check",
            "score": None,
            "status": "pending",
            "parent_hash": None,
            "timestamp": datetime.now(UTC).isoformat(),
            "feedback": "",
        }
        folder = shared / "attempts"
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / f"{commit}.json", json.dumps(attempt, indent=2), durable=False)
        return folder / f"{commit}.json"

    def daemon(self, coral: Path, env: dict[str, str], output: Path) -> Companion:
        """CORAL's grader daemon for ``coral``, to run beside the turn."""
        return Companion(
            args=[self.python, "-c", DAEMON_SCRIPT, str(coral)],
            cwd=coral,
            output=output,
            env=dict(env, PYTHONDONTWRITEBYTECODE="1"),
        )

    def finish(self, edge_dir: Path, worktree: Path, shared: Path, turn: int) -> None:
        """After the turn (its daemon stopped): the held attempts back, the daemon's leftovers gone."""
        held = edge_dir / f"held-t{turn}"
        if held.is_dir():
            (shared / "attempts").mkdir(parents=True, exist_ok=True)
            for path in sorted(held.iterdir()):
                if not (shared / "attempts" / path.name).exists():
                    os.replace(path, shared / "attempts" / path.name)
            shutil.rmtree(held, ignore_errors=True)
        for tmp in (*(shared / "attempts").glob(".*.json.tmp"), *(shared / "attempts").glob(f"{TMP_MARK}*")):
            tmp.unlink(missing_ok=True)  # a write the kill interrupted (CORAL's, or ours)
        self._clear_checkouts(edge_dir / ".coral", worktree)

    @staticmethod
    def _clear_checkouts(coral: Path, worktree: Path) -> None:
        """Remove the grader's checkouts a killed daemon left (and their entries in the repository)."""
        checkouts = coral / "private" / "grader_checkouts"
        if checkouts.is_dir() and not checkouts.is_symlink() and any(checkouts.iterdir()):
            shutil.rmtree(checkouts, ignore_errors=True)
            checkouts.mkdir()
            if worktree.exists():
                subprocess.run(["git", "worktree", "prune"], cwd=worktree, capture_output=True)


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(target)


def _pending_attempts(attempts: Path) -> list[Path]:
    """Attempt files CORAL's daemon would grade: status ``pending`` and no score."""
    found = []
    for path in sorted(attempts.glob("*.json")) if attempts.is_dir() else []:
        try:
            attempt = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(attempt, dict) and attempt.get("status") == "pending" and attempt.get("score") is None:
            found.append(path)
    return found
