"""A small CORAL task for tests: its grader, its config, a Student run's ``.coral``, CORAL itself.

The grader scores ``VALUE = <number>`` in solution.py (``VALUE = CRASH``: no
number). It is a real CORAL ``TaskGrader``, so the same task runs under the test
stand-in (tests/fixtures/coral_standin) and under CORAL when ``CORAL_SRC`` names a
checkout of it (the session fixture ``real_coral_bin`` of conftest installs it in a venv).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAND_IN_BIN = ROOT / "tests" / "fixtures" / "bin"

GRADER = """\
import re
from pathlib import Path

from coral.grader.task_grader import TaskGrader


class Grader(TaskGrader):
    def evaluate(self):
        text = (Path(self.codebase_path) / "solution.py").read_text()
        found = re.search(r"^VALUE\\s*=\\s*(\\S+)", text, re.M)
        try:
            value = float(found.group(1))
        except (AttributeError, ValueError):
            return self.fail("VALUE is not a number", feedback="grader crashed: VALUE is not a number")
        return self.score(value, feedback=f"VALUE = {value}")
"""

# The grader of another task: it scores kernel.cu, which this task's code has not.
OTHER_GRADER = """\
from pathlib import Path

from coral.grader.task_grader import TaskGrader


class Grader(TaskGrader):
    def evaluate(self):
        return self.score(float(len((Path(self.codebase_path) / "kernel.cu").read_text())))
"""

CONFIG = """\
task:
  name: speedup
  description: Make VALUE in solution.py as large as possible.
grader:
  timeout: 60
  direction: {direction}
  max_pending_per_agent: 1
"""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "student",
    "GIT_AUTHOR_EMAIL": "student@localhost",
    "GIT_COMMITTER_NAME": "student",
    "GIT_COMMITTER_EMAIL": "student@localhost",
}


def make_student_coral(run_dir: Path, direction: str = "maximize", grader: str = GRADER) -> Path:
    """A Student run ``run_dir`` of the task: ``.coral/`` (config, grader, shared dirs) and ``repo/``."""
    coral = run_dir / ".coral"
    (coral / "private" / "eval").mkdir(parents=True)
    (coral / "private" / "eval" / "grader.py").write_text(grader)
    (coral / "private" / "eval" / "data.txt").write_text("held-out data the agents never see\n")
    (coral / "config.yaml").write_text(CONFIG.format(direction=direction))
    for sub in ("attempts", "notes", "skills", "logs"):
        (coral / "public" / sub).mkdir(parents=True)
    (coral / "public" / "notes" / "tiling.md").write_text("# Tiling\nTiles of 64 were best.\n")
    repo = run_dir / "repo"
    repo.mkdir()
    (repo / "solution.py").write_text("VALUE = 1.0\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "seed")
    return coral


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=dict(os.environ, **GIT_ENV), capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def digest(root: Path) -> dict[str, str]:
    """Every path below ``root``: its kind and a hash of its bytes (or its link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = f"link {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def coral_env(bin_dir: Path) -> dict[str, str]:
    """The environment a ``coral`` in ``bin_dir`` runs in (first on PATH, a git identity)."""
    return dict(os.environ, **GIT_ENV, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def daemon(bin_dir: Path, coral: Path, log: Path) -> subprocess.Popen:
    """CORAL's grader daemon for ``coral``, started as the backend starts it (in the Python ``coral``
    of ``bin_dir`` names)."""
    from engine.teachers.opencode.coral import DAEMON_SCRIPT, coral_python

    env = coral_env(bin_dir)
    python = coral_python(f"{bin_dir / 'coral'} eval -m", None, env["PATH"])
    with open(log, "wb") as out:
        return subprocess.Popen(
            [python, "-c", DAEMON_SCRIPT, str(coral)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its group holds the grader it may be running: stopped with it
        )


def stop(proc: subprocess.Popen) -> None:
    """Stop a daemon and the grading it may be doing (which would write an attempt after it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def coral_eval(bin_dir: Path, workdir: Path, message: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "coral"), "eval", "-m", message, *extra],
        cwd=workdir,
        env=coral_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )


SHARED_ITEMS = ("notes", "skills", "attempts", "logs")
# The files of a live CORAL run's processes in its public/ (pids, heartbeats, the agents'
# logs): no shared knowledge, so never in a root's shared/.
LIVE_FILES = {
    "manager.pid": "4242\n",
    "agent.pids": "4243\n4244\n",
    "agent_pids.json": '{"agent-1": 4243, "agent-2": 4244}\n',
    "heartbeat/agent-1.json": '{"actions": []}\n',
    "logs/agent-1.log": "agent-1 started\n",
}


def make_coral_run(
    run_dir: Path,
    bin_dir: Path,
    evals: list[tuple[str, str]],
    pending: list[tuple[str, str]],
    direction: str = "maximize",
) -> Path:
    """A Student run laid out as ``coral start`` lays it out, with its attempts made by hand.

    Agents work in worktrees ``agents/<id>`` (branch ``coral/<id>`` of ``repo``) holding
    the breadcrumbs and ``.opencode/`` links into ``.coral/public``. ``evals`` are
    (agent, VALUE) submissions graded one after the other by the grader daemon;
    ``pending`` are submitted afterwards, with the daemon stopped. ``public/.git`` is
    started by the first submission, as in a run from before CORAL checkpointed at start.
    """
    coral = make_student_coral(run_dir, direction)
    agents = sorted({agent for agent, _ in evals + pending})
    for name, text in LIVE_FILES.items():  # what `coral start` keeps in public/, checkpointed with it
        (coral / "public" / name).parent.mkdir(parents=True, exist_ok=True)
        (coral / "public" / name).write_text(text)
    for agent in agents:
        tree = run_dir / "agents" / agent
        git(run_dir / "repo", "worktree", "add", "-q", "-b", f"coral/{agent}", str(tree))
        (tree / ".gitignore").write_text(".coral_dir\n.coral_agent_id\n.opencode/\n")
        (tree / ".coral_dir").write_text(str(coral))
        (tree / ".coral_agent_id").write_text(agent)
        (tree / ".opencode").mkdir()
        for item in SHARED_ITEMS:
            (tree / ".opencode" / item).symlink_to(coral / "public" / item)
    # The first submission is made before the daemon starts: it starts public/.git with nothing written
    # between the repository's first commit and its checkpoint (a heartbeat of the daemon there would make
    # the first attempt's checkpoint a commit of its own); it is graded first once the daemon runs.
    grader = None
    try:
        for i, (agent, value) in enumerate(evals):
            tree = run_dir / "agents" / agent
            (tree / "solution.py").write_text(f"VALUE = {value}\n")
            (tree / ".opencode" / "notes" / f"note-{i}.md").write_text(f"{agent} tried {value}\n")
            done = coral_eval(bin_dir, tree, f"{agent} tries {value}", *(() if grader else ("--no-wait",)))
            assert done.returncode == 0, done.stdout + done.stderr
            if grader is None:
                grader = daemon(bin_dir, coral, run_dir / "daemon.log")
                graded_all(coral)
    finally:
        if grader is not None:
            stop(grader)
    for agent, value in pending:
        tree = run_dir / "agents" / agent
        (tree / "solution.py").write_text(f"VALUE = {value}\n")
        done = coral_eval(bin_dir, tree, f"{agent} tries {value}", "--no-wait")
        assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def graded_all(coral: Path, within: float = 600) -> None:
    """Wait until no attempt of the run is pending (the daemon graded them), at most ``within`` seconds."""
    deadline = time.monotonic() + within
    attempts = coral / "public" / "attempts"
    while any(json.loads(p.read_text()).get("status") == "pending" for p in attempts.glob("*.json")):
        assert time.monotonic() < deadline, f"the grader daemon graded nothing within {within} s"
        time.sleep(0.1)


def attempts_in_order(run: Path) -> list[dict]:
    """The run's attempts in submission order, read independently of the code under test."""
    found = [json.loads(p.read_text()) for p in (run / ".coral" / "public" / "attempts").glob("*.json")]
    return sorted(found, key=lambda a: a["timestamp"])


def check_written_root(folder: Path, run: Path, attempt: dict) -> None:
    """A pick written out: code = the commit's tree, shared = its checkpoint plus its own graded attempt."""
    commit = attempt["commit_hash"]
    repo, public = run / "repo", run / ".coral" / "public"
    assert sorted(p.name for p in (folder / "code").iterdir()) == sorted(
        git(repo, "ls-tree", "--name-only", commit).split()
    )
    assert (folder / "code" / "solution.py").read_text() == git(repo, "show", f"{commit}:solution.py") + "\n"
    checkpoint = attempt.get("shared_state_hash") or git(public, "rev-list", "--max-parents=0", "HEAD")
    checkpointed = set(git(public, "ls-tree", "-r", "--name-only", checkpoint).split())
    assert checkpointed >= set(LIVE_FILES)  # the test means something: the checkpoint holds them
    # ... and what the grader daemon and the checkpoint write there, as CORAL's do.
    not_knowledge = set(LIVE_FILES) | {"grader_daemon_heartbeat", ".gitignore"}
    expected = (checkpointed - not_knowledge) | {f"attempts/{commit}.json"}
    written = {str(p.relative_to(folder / "shared")) for p in (folder / "shared").rglob("*") if p.is_file()}
    assert written == expected, written ^ expected
    assert (folder / "shared" / "attempts" / f"{commit}.json").read_bytes() == (
        public / "attempts" / f"{commit}.json"
    ).read_bytes()
    assert (folder / "coral_config.yaml").read_bytes() == (run / ".coral" / "config.yaml").read_bytes()
