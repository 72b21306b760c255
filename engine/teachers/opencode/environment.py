"""The environment OpenCode runs in: its own HOME and XDG dirs, and its config.

Everything OpenCode keeps (its session database, logs, snapshot repos) lives under
its store, ``<run>/opencode/`` (on a cluster node, a directory of that node's: see
``node_store``). The store is OpenCode's HOME (a git identity is set for the commits of the
Teacher's eval unless the environment has one); its config comes through
``OPENCODE_CONFIG_CONTENT``: the
model, and for an endpoint an OpenAI-compatible provider whose key is read from the
variable named by ``api_key_env`` (the key is never recorded).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from engine.teachers.opencode.processes import RUN_ENV
from engine.teachers.opencode.worktrees import GIT_IDENTITY
from ingest.errors import InputError, ProjectError

REPO_ROOT = Path(__file__).resolve().parents[3]
LANE = re.compile(r"opencode-lane(\d+)\.db")


def find_binary(configured: str | None) -> str:
    """The opencode executable: the configured one, else the repository's npm install, else PATH."""
    candidates = (
        [configured]
        if configured
        else [
            str(REPO_ROOT / "node_modules" / ".bin" / "opencode"),
            shutil.which("opencode"),
        ]
    )
    for c in candidates:
        if c and Path(c).exists():
            return str(Path(c).resolve())
    raise InputError(
        "opencode not found: run `npm install` in the repository (it installs opencode-ai) "
        "or set backend_options.opencode_bin"
    )


def opencode_config(opts: Any, base_url: str | None = None) -> dict[str, Any]:
    """OpenCode's config for these backend options (the key read from its variable).

    ``base_url`` replaces the endpoint (the recorder's address for one turn).
    """
    provider, model = opts.model.split("/", 1)
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "model": opts.model,
        "small_model": opts.model,
        "autoupdate": False,
        "share": "disabled",
    }
    if opts.endpoint:
        key = api_key(opts)
        config["provider"] = {
            provider: {
                "npm": "@ai-sdk/openai-compatible",
                "name": provider,
                "options": {"baseURL": base_url or opts.endpoint, "apiKey": key},
                "models": {
                    model: {"name": model, "limit": {"context": opts.context_limit, "output": opts.output_limit}}
                },
            }
        }
    config.update(opts.opencode_config)
    return config


def api_key(opts: Any) -> str:
    """The endpoint's key: the value of the variable ``api_key_env`` names, else ``none`` (as OpenCode sends it)."""
    return os.environ.get(opts.api_key_env or "", "") or "none"


def node_store(root: str | None, run_dir: Path, node: str) -> Path:
    """The store of a cluster node's turns: on the node's own disk (SQLite wants a local
    file), under ``root`` (default: the temporary directory), one per run and node."""
    run_dir = Path(run_dir).resolve()
    run_key = f"{run_dir.name}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"
    return Path(root or tempfile.gettempdir()) / "teacher-mcts-nodes" / run_key / node[:16]


class Environment:
    """OpenCode's store (``home``, default ``<run>/opencode``) and the variables every turn runs with."""

    def __init__(self, run_dir: Path, opts: Any, home: Path | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.opts = opts
        self.home = Path(home) if home else self.run_dir / "opencode"
        self.bin = find_binary(opts.opencode_bin)
        for sub in ("data", "config", "cache", "state"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        self.database = self.home / "data" / "opencode" / "opencode.db"
        # HOME is the run's, so no ~/.gitconfig: commits the Teacher's eval makes
        # (``coral eval`` runs a plain ``git commit``) take this identity unless one is set.
        self.env = {**GIT_IDENTITY, **os.environ}
        self.env.update(
            HOME=str(self.home),
            XDG_DATA_HOME=str(self.home / "data"),
            XDG_CONFIG_HOME=str(self.home / "config"),
            XDG_CACHE_HOME=str(self.home / "cache"),
            XDG_STATE_HOME=str(self.home / "state"),
            OPENCODE_CONFIG_CONTENT=json.dumps(opencode_config(opts)),
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_PERMISSION=json.dumps({"question": "deny"}),
            # OpenCode installs its plugin package into every config dir it loads - a worktree's
            # ``.opencode/`` (the shared knowledge) too - in the background, where a registry is
            # reachable. A Teacher's OpenCode installs nothing: what it runs with is what it has.
            npm_config_offline="true",
            **{RUN_ENV: str(self.run_dir)},
        )

    def lane_database(self, lane: int) -> Path:
        """The database of lane ``lane`` of served turns (lane 0 is the store's own)."""
        return self.database if lane == 0 else self.database.with_name(f"opencode-lane{lane}.db")

    def databases(self) -> dict[int, Path]:
        """The store's databases that exist, by lane: its own (0), then its lanes' in order."""
        lanes = sorted((int(m[1]), p) for p in self.database.parent.glob("*.db") if (m := LANE.fullmatch(p.name)))
        return {k: d for k, d in ((0, self.database), *lanes) if d.exists()}

    def on_database(self, database: Path) -> Environment:
        """This store with OpenCode's database at ``database`` (``OPENCODE_DB``; a lane's)."""
        other = copy.copy(self)
        other.database = database
        other.env = dict(self.env, OPENCODE_DB=str(database)) if database != self.database else self.env
        return other

    def through(self, base_url: str) -> dict[str, str]:
        """The variables of a turn whose requests go to ``base_url`` (the recorder) instead."""
        return dict(self.env, OPENCODE_CONFIG_CONTENT=json.dumps(opencode_config(self.opts, base_url)))

    def version(self) -> str:
        """What ``opencode --version`` prints (ProjectError when it cannot run)."""
        try:
            done = subprocess.run(
                [self.bin, "--version"],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ProjectError(f"{self.bin} --version could not run: {err}") from err
        if done.returncode != 0 or not done.stdout.strip():
            msg = done.stderr.decode(errors="replace").strip()[-500:]
            raise ProjectError(f"{self.bin} --version failed: {msg}")
        return done.stdout.decode(errors="replace").strip().splitlines()[-1]

    def init_database(self) -> None:
        """Create OpenCode's database before any turn runs.

        Several first runs creating it at once can lose a session's events (seen
        here: a turn with no tool calls, or with no eval, only when two fresh runs
        started together), so one command creates it first.
        """
        with open(self.home / ".init.lock", "w") as lock:  # the Teachers of a node share its store
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.database.exists():
                return
            done = subprocess.run(
                [self.bin, "session", "list"],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
            )
        if done.returncode != 0:
            msg = done.stderr.decode(errors="replace").strip()[-500:]
            raise ProjectError(f"{self.bin} could not start: {msg}")
