"""A small CORAL task for tests: its grader, its config, a Student run's ``.coral``, CORAL itself.

The grader scores ``VALUE = <number>`` in solution.py (``VALUE = CRASH``: no
number). It is a real CORAL ``TaskGrader``, so the same task runs under the test
stand-in (tests/fixtures/coral_standin) and under CORAL when ``CORAL_SRC`` names a
checkout of it (``coral_install`` installs it in a venv of the test session).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAND_IN_BIN = ROOT / "tests" / "fixtures" / "bin"

GRADER = '''\
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
'''

CONFIG = """\
task:
  name: speedup
  description: Make VALUE in solution.py as large as possible.
grader:
  timeout: 60
  direction: {direction}
  max_pending_per_agent: 1
"""

GIT_ENV = {"GIT_AUTHOR_NAME": "student", "GIT_AUTHOR_EMAIL": "student@localhost",
           "GIT_COMMITTER_NAME": "student", "GIT_COMMITTER_EMAIL": "student@localhost"}  # fmt: skip


def make_student_coral(run_dir: Path, direction: str = "maximize") -> Path:
    """A Student run ``run_dir`` of the task: ``.coral/`` (config, grader, shared dirs) and ``repo/``."""
    coral = run_dir / ".coral"
    (coral / "private" / "eval").mkdir(parents=True)
    (coral / "private" / "eval" / "grader.py").write_text(GRADER)
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
    done = subprocess.run(["git", *args], cwd=cwd, env=dict(os.environ, **GIT_ENV), capture_output=True,
                          text=True, check=True)  # fmt: skip
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


@pytest.fixture(scope="session")
def real_coral_bin(tmp_path_factory) -> Path:
    """A dir holding the ``coral`` of CORAL installed from ``$CORAL_SRC`` in a venv (skips without it)."""
    src = os.environ.get("CORAL_SRC")
    if not src:
        pytest.skip("CORAL_SRC is not set: point it at a checkout of Human-Agent-Society/CORAL "
                    "to run the checks against the real CORAL (CI cannot install it)")  # fmt: skip
    venv = tmp_path_factory.mktemp("coral-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A checkout without tags (or an archive) has no version for hatch-vcs to derive.
    env = dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION",
                                                                         "0.0.0+src"))  # fmt: skip
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", src], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    bin_dir = venv / "coral-bin"  # only `coral` (the venv's bin would put its python first on PATH)
    bin_dir.mkdir()
    (bin_dir / "coral").symlink_to(venv / "bin" / "coral")
    return bin_dir
