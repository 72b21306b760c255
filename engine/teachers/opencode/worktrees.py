"""Git repositories and worktrees: one repository per tree, one worktree per edge.

Every tree gets a git repository holding its root snapshot's code; every edge its
own worktree (``<worktrees>/<tree>/<edge>/wt``) at its parent's commit, with a copy
of the parent's shared-knowledge dir inside (never committed). Every path given to
git is absolute.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ingest import coral_run
from ingest.errors import InputError, ProjectError

NOT_SHARED = frozenset({".git", "node_modules"}) | coral_run.RUNTIME  # never copied from a shared dir (copy_dir)
CORAL_BREADCRUMBS = ("/.coral_dir", "/.coral_agent_id")  # how `coral eval` finds its run (coral.py)
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "teacher-mcts",
    "GIT_AUTHOR_EMAIL": "teacher@localhost",
    "GIT_COMMITTER_NAME": "teacher-mcts",
    "GIT_COMMITTER_EMAIL": "teacher@localhost",
}


def git(*args: str, cwd: Path) -> str:
    """Run git in ``cwd``; ProjectError with git's message when it fails."""
    done = subprocess.run(["git", *args], cwd=cwd, env=dict(os.environ, **GIT_IDENTITY), capture_output=True, text=True)
    if done.returncode != 0:
        raise ProjectError(f"git {' '.join(args)} in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def safe_name(name: str) -> str:
    """A tree or edge id as a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


REMOVE_S = 60.0  # how long a directory something still writes into is tried again


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all it holds (nothing when it is not there).

    Something the last turn left may still write into it for a moment (a server's
    detached plugin install into ``.opencode/``, a process dying): a removal that
    finds a directory refilled behind it is tried again, up to ``REMOVE_S``; after
    that, ProjectError names the path.
    """
    deadline = time.monotonic() + REMOVE_S
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError as err:
            if isinstance(err, FileNotFoundError) and not path.exists():
                return  # (not there; else a file under it went meanwhile: again)
            if err.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST) or time.monotonic() > deadline:
                raise ProjectError(f"{path}: cannot remove it ({err.strerror or err})") from err
        time.sleep(0.1)


def copy_dir(src: Path | None, dest: Path) -> None:
    """Make ``dest`` a copy of ``src`` (or an empty directory when there is none).

    Left out at the top of ``src`` (``NOT_SHARED``): ``.git``, where CORAL keeps the
    checkpoint repository of a shared dir it used, which a copy for the next state
    does not carry; ``node_modules``, where OpenCode installs its plugin package
    into a project's ``.opencode/`` when a registry is reachable (not knowledge; a
    CORAL run's shared dir never holds it); and CORAL's runtime files
    (``ingest.coral_run.RUNTIME``: pid files, heartbeats, logs), which a root made
    before they were left out of roots may still hold.
    """
    remove_tree(dest)
    if src is None or not Path(src).is_dir():
        dest.mkdir(parents=True)
        return
    top = Path(src)

    def not_shared(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n in NOT_SHARED] if Path(folder) == top else []

    shutil.copytree(top, dest, symlinks=True, ignore=not_shared)


class Worktrees:
    """The repositories and worktrees under ``root`` (absolute), one lock per tree."""

    def __init__(self, root: Path, shared_dir: str) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared_dir = shared_dir
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @contextlib.contextmanager
    def lock(self, tree_dir: str) -> Iterator[None]:
        """Hold one tree's repository: git refuses concurrent worktree changes, from this
        process's threads or another process's (the nodes of a cluster on one machine share
        the worktrees: two ``git worktree add`` at once both took ``.git/worktrees/wt``)."""
        with self._locks_lock:
            held = self._locks.setdefault(tree_dir, threading.Lock())
        (self.root / tree_dir).mkdir(parents=True, exist_ok=True)
        with held, open(self.root / tree_dir / "repo.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def edge_dir(self, tree_id: str, edge_id: str) -> Path:
        return self.root / safe_name(tree_id) / safe_name(edge_id)

    def root_repo(self, tree_id: str, code: Path) -> tuple[Path, str]:
        """The tree's repository (made once from the snapshot's ``code/``) and its commit."""
        repo = self.root / safe_name(tree_id) / "repo"
        with self.lock(repo.parent.name):
            if not (repo / ".git").exists():
                if not code.is_dir():
                    raise InputError(f"{code.parent}: the root snapshot has no code/ directory")
                tmp = repo.with_name("repo.tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(code, tmp, symlinks=True, ignore=shutil.ignore_patterns(".git"))
                git("init", "-q", cwd=tmp)
                git("add", "-A", cwd=tmp)
                git("commit", "-q", "--allow-empty", "-m", f"root {tree_id}", cwd=tmp)
                os.rename(tmp, repo)
            for rule in (f"/{self.shared_dir}/", *CORAL_BREADCRUMBS):
                self._exclude(repo, rule)
            return repo, git("rev-parse", "HEAD", cwd=repo)

    @staticmethod
    def _exclude(repo: Path, rule: str) -> None:
        """Keep ``rule`` out of every commit of the repository (its info/exclude)."""
        exclude = repo / ".git" / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        if rule not in (exclude.read_text() if exclude.exists() else "").splitlines():
            with open(exclude, "a") as fh:
                fh.write(f"\n{rule}\n")

    def prepare(self, repo: Path, worktree: Path, commit: str, fresh: bool) -> None:
        """A worktree at ``commit``: a fresh one (turn 1), or the existing one reset to it (turn 2)."""
        with self.lock(repo.parent.name):
            if fresh or not worktree.exists():
                self._remove(repo, worktree)
                worktree.parent.mkdir(parents=True, exist_ok=True)
                git("worktree", "add", "-q", "--detach", str(worktree), commit, cwd=repo)
            else:
                git("reset", "-q", "--hard", commit, cwd=worktree)
                git("clean", "-q", "-fdx", "-e", f"/{self.shared_dir}/", cwd=worktree)

    def discard(self, repo: Path, worktree: Path) -> None:
        """Remove an edge's worktree and everything beside it."""
        with self.lock(repo.parent.name):
            self._remove(repo, worktree)
            shutil.rmtree(worktree.parent, ignore_errors=True)

    @staticmethod
    def _remove(repo: Path, worktree: Path) -> None:
        if worktree.exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=repo, capture_output=True)
            shutil.rmtree(worktree, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
