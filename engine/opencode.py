"""The real Teacher: OpenCode sessions in forked git worktrees, scored by ``coral eval``.

Every tree gets a git repository holding its root snapshot's code; every edge gets
its own worktree (``<worktrees>/<tree>/<edge>/wt``) with a copy of the parent's
shared-knowledge dir at ``.opencode/`` (where CORAL exposes it to OpenCode agents;
the repository excludes it from commits). A turn forks the session it starts from
(``opencode run --session S --fork``; a fresh session from a root), so every
recorded state — commit, session, shared-dir snapshot — stays immutable and can be
forked again: by the edge's turn 2, by the node's children, or by a resumed run.

OpenCode binds a session to the directory it was created in; before forking, the
source session's directory is pointed at the new worktree (OpenCode's own SQLite
database, ``session.directory``), so the fork and its tools run there.

A turn's stream is parsed as it arrives (``ingest.opencode``); its eval result is the
attempt JSON that ``coral eval`` wrote for the new commit
(``.opencode/attempts/<commit>.json``), else the block the eval printed, else none.
A turn that exceeds its timeout, or is cancelled, is killed with every process it
started — including tool processes that left its process group — found by a marker
in their environment; a run's other mark lets a resumed run stop what a killed
process of the run left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config import RunConfig, problems
from engine.teacher import FactSink, RootInfo, TurnCancelled, TurnRequest
from ingest.errors import InputError, ProjectError
from ingest.events import EvalFinished, Event, TurnFinished
from ingest.opencode import StreamParser
from ingest.snapshots import numeric_score

REPO_ROOT = Path(__file__).resolve().parent.parent
MARKER_ENV = "TEACHER_MCTS_TURN"
RUN_ENV = "TEACHER_MCTS_RUN"  # every process of a run's turns: its run directory
EVAL_BLOCK = re.compile(
    r"CORAL Eval \(#\d+\):\s*(\S+)\s*\nCommit:\s*(\S+)\s*\nStatus:\s*(\S+)(?:\s*\nFeedback:\s*(.*))?"
)

TURN1 = (
    "You are improving this repository for the task \"{task}\". Shared knowledge from earlier "
    "attempts by other agents is in `.opencode/` (notes/, skills/, attempts/): read what helps, "
    "and write a note about what you learn. Make one focused improvement, check it locally, then "
    "finish this attempt by running `{eval_command} \"<one-line summary of the change>\"`.\n"
    "[edge {edge_id} turn {turn}]"
)
TURN2 = (
    "Read the eval result of your last attempt and make a further improvement, then finish "
    "again by running `{eval_command} \"<one-line summary of the change>\"`.\n"
    "[edge {edge_id} turn {turn}]"
)


class OpenCodeOptions(BaseModel):
    """``backend_options`` of an ``opencode`` run (TOML ``[backend_options]``)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(pattern=r"^[^/\s]+/\S+$", description="provider/model")
    endpoint: str | None = Field(None, description="OpenAI-compatible base URL (…/v1)")
    api_key_env: str | None = Field(None, description="environment variable holding the key")
    context_limit: int = 200_000
    output_limit: int = 8_192
    opencode_bin: str | None = None
    opencode_config: dict[str, Any] = Field(default_factory=dict)
    eval_command: str = "coral eval -m"
    turn_timeout_s: float = Field(1800.0, gt=0)
    prompt_turn1: str = TURN1
    prompt_turn2: str = TURN2
    worktree_root: str | None = None
    shared_dir: str = ".opencode"
    attempts_subdir: str = "attempts"


def resolve_options(config: RunConfig) -> dict[str, Any]:
    """Validated backend options with defaults, safe to record (no secret values)."""
    options = dict(config.backend_options)
    for key in ("api_key", "apiKey"):
        if key in options:
            raise InputError(
                f"backend_options.{key}: do not put the key in the config; "
                "put it in an environment variable and set api_key_env"
            )
    try:
        return OpenCodeOptions.model_validate(options).model_dump()
    except ValidationError as err:
        raise InputError(f"opencode backend options: {problems(err)}") from err


def _find_binary(configured: str | None) -> str:
    candidates = [configured] if configured else [
        str(REPO_ROOT / "node_modules" / ".bin" / "opencode"), shutil.which("opencode"),
    ]  # fmt: skip
    for c in candidates:
        if c and Path(c).exists():
            return c
    raise InputError(
        "opencode not found: run `npm install` in the repository (it installs opencode-ai) "
        "or set backend_options.opencode_bin"
    )


def _git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="teacher-mcts", GIT_AUTHOR_EMAIL="teacher@localhost",
               GIT_COMMITTER_NAME="teacher-mcts", GIT_COMMITTER_EMAIL="teacher@localhost")  # fmt: skip
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ProjectError(f"git {' '.join(args)} in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _copy_dir(src: Path | None, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    if src is not None and Path(src).is_dir():
        shutil.copytree(src, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)


def kill_marked(marker: str, name: str = MARKER_ENV) -> list[int]:
    """SIGKILL every process whose environment carries ``name=marker``."""
    needle = f"{name}={marker}".encode()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except ProcessLookupError:
                pass
    return killed


class OpenCodeTeacher:
    """Runs turns with ``opencode run --format json`` (see the module docstring)."""

    name = "opencode"

    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.opts = OpenCodeOptions.model_validate(resolve_options(config))
        self.task = config.task or "task"
        self.bin = _find_binary(self.opts.opencode_bin)
        self.run_dir = Path(run_dir).resolve()
        self.home = Path(run_dir) / "opencode"
        self.worktrees = Path(self.opts.worktree_root or Path(run_dir) / "worktrees")
        self.worktrees.mkdir(parents=True, exist_ok=True)
        self.env = self._environment()
        # Sessions a killed process of this run left running (kill -9 skips every
        # cleanup) would go on writing into worktrees its turns are re-run in. Only
        # this run's writer starts them, so whatever carries the run's mark is left over.
        kill_marked(self.env[RUN_ENV], RUN_ENV)
        self._init_database()
        self._tree_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._markers: set[str] = set()

    # -- environment

    def _environment(self) -> dict[str, str]:
        for sub in ("data", "config", "cache", "state"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        provider, model = self.opts.model.split("/", 1)
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "model": self.opts.model, "small_model": self.opts.model,
            "autoupdate": False, "share": "disabled",
        }  # fmt: skip
        if self.opts.endpoint:
            key = os.environ.get(self.opts.api_key_env or "", "") or "none"
            config["provider"] = {provider: {
                "npm": "@ai-sdk/openai-compatible", "name": provider,
                "options": {"baseURL": self.opts.endpoint, "apiKey": key},
                "models": {model: {"name": model, "limit": {
                    "context": self.opts.context_limit, "output": self.opts.output_limit}}},
            }}  # fmt: skip
        config.update(self.opts.opencode_config)
        env = dict(os.environ)
        env.update(
            HOME=str(self.home), XDG_DATA_HOME=str(self.home / "data"),
            XDG_CONFIG_HOME=str(self.home / "config"), XDG_CACHE_HOME=str(self.home / "cache"),
            XDG_STATE_HOME=str(self.home / "state"), OPENCODE_CONFIG_CONTENT=json.dumps(config),
            OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_PERMISSION=json.dumps({"question": "deny"}),
            **{RUN_ENV: str(self.run_dir)},
        )  # fmt: skip
        return env

    def _init_database(self) -> None:
        """Create OpenCode's database before any turn runs.

        Several first runs creating it at once can lose a session's events (seen
        here: a turn with no tool calls, or with no eval, only when two fresh runs
        started together), so one command creates it first.
        """
        if (self.home / "data" / "opencode" / "opencode.db").exists():
            return
        done = subprocess.run([self.bin, "session", "list"], env=self.env, cwd=self.home,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            msg = done.stderr.decode(errors="replace").strip()[-500:]
            raise ProjectError(f"{self.bin} could not start: {msg}")

    def _tree_lock(self, tree_id: str) -> threading.Lock:
        with self._locks_lock:
            return self._tree_locks.setdefault(tree_id, threading.Lock())

    # -- Teacher interface

    def root_state(self, root: RootInfo) -> dict[str, Any]:
        """A git repository with the snapshot's code (made once per tree)."""
        repo = self.worktrees / _safe(root.tree_id) / "repo"
        with self._tree_lock(root.tree_id):
            if not (repo / ".git").exists():
                code = Path(root.path) / "code"
                if not code.is_dir():
                    raise InputError(f"{root.path}: the root snapshot has no code/ directory")
                tmp = repo.with_name("repo.tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(code, tmp, symlinks=True, ignore=shutil.ignore_patterns(".git"))
                _git("init", "-q", cwd=tmp)
                _git("add", "-A", cwd=tmp)
                _git("commit", "-q", "--allow-empty", "-m", f"root {root.tree_id}", cwd=tmp)
                os.rename(tmp, repo)
            # The shared-knowledge copy lives in the worktree but is never committed.
            exclude = repo / ".git" / "info" / "exclude"
            exclude.parent.mkdir(parents=True, exist_ok=True)
            rule = f"/{self.opts.shared_dir}/"
            if rule not in (exclude.read_text() if exclude.exists() else ""):
                with open(exclude, "a") as fh:
                    fh.write(f"\n{rule}\n")
            commit = _git("rev-parse", "HEAD", cwd=repo)
        return {"repo": str(repo), "commit": commit, "session": None,
                "shared": str(Path(root.path) / "shared")}  # fmt: skip

    def discard(self, state: dict[str, Any]) -> None:
        """Remove the worktree (and shared snapshots) of a pruned or retried edge."""
        worktree = state.get("worktree")
        if not worktree:
            return
        edge_dir = Path(worktree).parent
        repo = Path(state["repo"])
        with self._tree_lock(repo.parent.name):
            if Path(worktree).exists():
                subprocess.run(["git", "worktree", "remove", "--force", worktree], cwd=repo,
                               capture_output=True)  # fmt: skip
            shutil.rmtree(edge_dir, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)

    def close(self) -> None:
        for marker in list(self._markers):
            kill_marked(marker)

    def run_turn(self, request: TurnRequest, on_fact: FactSink, cancel: threading.Event) -> list[Event]:
        start = request.start_state
        repo = Path(start["repo"])
        edge_dir = self.worktrees / _safe(request.tree_id) / _safe(request.edge_id)
        worktree = edge_dir / "wt"
        shared = worktree / self.opts.shared_dir
        with self._tree_lock(request.tree_id):
            self._prepare(repo, worktree, start, request.turn)
        _copy_dir(Path(start["shared"]) if start.get("shared") else None, shared)
        source = start.get("session")
        if source:
            self._move_session(source, worktree)
        before = _git("rev-parse", "HEAD", cwd=worktree)
        prompt = (self.opts.prompt_turn1 if request.turn == 1 else self.opts.prompt_turn2).format(
            task=self.task, edge_id=request.edge_id, turn=request.turn,
            eval_command=self.opts.eval_command,
        )  # fmt: skip
        started_at = datetime.now(UTC)
        t0 = time.monotonic()
        lines, facts, parser, outcome, error = self._run(request, worktree, source, prompt, on_fact, cancel)
        wall = time.monotonic() - t0
        after = _git("rev-parse", "HEAD", cwd=worktree)
        score, status, feedback, origin = self._eval_result(shared, before, after, lines)
        if outcome == "timeout":
            score, status = None, "timeout"
        snapshot = edge_dir / f"shared-t{request.turn}"
        _copy_dir(shared, snapshot)
        ids = {"tree_id": request.tree_id, "edge_id": request.edge_id, "turn": request.turn}
        facts.append(EvalFinished(**ids, score=score, eval_status=status, commit_hash=after,
                                  source=origin, feedback=feedback))  # fmt: skip
        facts.append(TurnFinished(
            **ids, session_id=parser.summary.session_id, context_tokens=parser.summary.context_tokens,
            outcome=outcome, error=error,
            state={"repo": str(repo), "worktree": str(worktree), "commit": after,
                   "session": parser.summary.session_id or source, "shared": str(snapshot)},
            started_at=started_at.isoformat(), wall_seconds=round(wall, 3),
            prompt=prompt, transcript="".join(lines),
        ))  # fmt: skip
        return facts

    # -- the turn

    def _prepare(self, repo: Path, worktree: Path, start: dict[str, Any], turn: int) -> None:
        """Turn 1: a fresh worktree at the parent's commit. Turn 2: reset to turn 1's end."""
        if turn == 1 or not worktree.exists():
            if worktree.exists():
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=repo,
                               capture_output=True)  # fmt: skip
                shutil.rmtree(worktree, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
            worktree.parent.mkdir(parents=True, exist_ok=True)
            _git("worktree", "add", "-q", "--detach", str(worktree), start["commit"], cwd=repo)
        else:
            _git("reset", "-q", "--hard", start["commit"], cwd=worktree)
            _git("clean", "-q", "-fdx", "-e", f"/{self.opts.shared_dir}/", cwd=worktree)

    def _move_session(self, session: str, worktree: Path) -> None:
        """Point a session at the worktree, so that its fork runs there."""
        db = self.home / "data" / "opencode" / "opencode.db"
        if not db.exists():
            raise ProjectError(f"{db}: OpenCode's database is missing (session {session})")
        with sqlite3.connect(db, timeout=30) as con:
            updated = con.execute("update session set directory = ? where id = ?",
                                  (str(worktree), session)).rowcount  # fmt: skip
        if updated != 1:
            raise ProjectError(f"OpenCode session {session} not found in {db}")

    def _run(self, request, worktree, source, prompt, on_fact, cancel):
        marker = f"{request.edge_id}#{request.turn}#{uuid.uuid4().hex[:8]}"
        self._markers.add(marker)
        args = [self.bin, "run", "--format", "json", "--model", self.opts.model, "--dir", str(worktree)]
        args += ["--session", source, "--fork"] if source else ["--title", f"{request.edge_id} turn {request.turn}"]
        env = dict(self.env, PWD=str(worktree), **{MARKER_ENV: marker})
        parser = StreamParser(request.tree_id, request.edge_id, request.turn)
        lines: list[str] = []
        facts: list[Event] = []
        prompt_file = worktree.parent / f"prompt-t{request.turn}.txt"
        prompt_file.write_text(prompt)
        with open(prompt_file, "rb") as stdin, open(worktree.parent / f"stderr-t{request.turn}.log", "wb") as err:
            proc = subprocess.Popen(args, cwd=worktree, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=err, start_new_session=True)  # fmt: skip

            def read() -> None:
                for raw in proc.stdout:
                    line = raw.decode("utf-8", errors="replace")
                    lines.append(line)
                    for fact in parser.feed(line):
                        facts.append(fact)
                        on_fact(fact)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            deadline = time.monotonic() + (request.timeout_s or self.opts.turn_timeout_s)
            outcome, error = "completed", None
            while proc.poll() is None:
                if cancel.is_set():
                    self._kill(proc, marker)
                    raise TurnCancelled(f"{request.edge_id} turn {request.turn} cancelled")
                if time.monotonic() > deadline:
                    self._kill(proc, marker)
                    outcome, error = "timeout", f"turn timed out after {self.opts.turn_timeout_s:.0f} s"
                    break
                time.sleep(0.1)
            reader.join(timeout=10)
            kill_marked(marker)  # tool processes that outlived opencode
            self._markers.discard(marker)
        if outcome == "completed" and (proc.returncode != 0 or parser.summary.errors):
            outcome = "error"
            stderr = worktree.parent / f"stderr-t{request.turn}.log"
            detail = "; ".join(parser.summary.errors) or stderr.read_text(errors="replace")[-500:]
            error = f"opencode exited with {proc.returncode}: {detail}".strip()
        return lines, facts, parser, outcome, error

    def _kill(self, proc: subprocess.Popen, marker: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_marked(marker)
        proc.wait(timeout=30)

    def _eval_result(self, shared: Path, before: str, after: str, lines: list[str]):
        """(score, status, feedback, source) of the turn's last eval."""
        if after != before:
            path = shared / self.opts.attempts_subdir / f"{after}.json"
            try:
                attempt = json.loads(path.read_text())
            except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON
                attempt = None
            if isinstance(attempt, dict):
                score, _ = numeric_score(attempt.get("score"))
                status = attempt.get("status") if isinstance(attempt.get("status"), str) else None
                feedback = attempt.get("feedback") if isinstance(attempt.get("feedback"), str) else None
                return score, status, feedback, "attempt_json"
        printed = self._printed_block(lines)
        if printed is not None:
            return printed
        return None, "no_eval", None, "none"

    def _printed_block(self, lines: list[str]):
        last = None
        eval_word = self.opts.eval_command.split()[0]
        for line in lines:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # the parser recorded the line as skipped
                continue
            part = obj.get("part") if isinstance(obj, dict) else None
            state = part.get("state") if isinstance(part, dict) else None
            inputs = state.get("input") if isinstance(state, dict) else None
            if not isinstance(inputs, dict):
                continue
            command = str(inputs.get("command", ""))
            if part.get("tool") in ("bash", "shell") and eval_word in command:
                found = EVAL_BLOCK.findall(str(state.get("output") or ""))
                if found:
                    last = found[-1]
        if last is None:
            return None
        raw, _commit, status, feedback = last
        try:
            score, _ = numeric_score(float(raw))
        except ValueError:
            score = None
        return score, status, feedback or None, "printed_block"
