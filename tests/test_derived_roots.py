"""Where derived state cannot be kept: reads still answer, from a temporary state removed when the process ends.

A read-only data directory, a full disk (a small tmpfs mounted in a user namespace of the
test's own), a full temporary directory too: each reader answers as the log, says once
where the state went, and leaves nothing behind in the temporary directory.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, copy_run

from engine.derived.files import FALLBACK_PREFIX

QUERY = "select run_id, tree_id, best_score, kept_edges from trees order by all"
DEADLINE_S = 900


def run_cli(args: list[str], tmpdir: Path, prefix: list[str] = (), mounts: str = "") -> subprocess.CompletedProcess:
    """``python cli.py ARGS`` in a process of its own (``prefix``: e.g. unshare), TMPDIR set; ``mounts``:
    shell commands run first in the same mount namespace."""
    command = shlex.join([sys.executable, str(ROOT / "cli.py"), *args])
    script = f"{mounts} exec {command}" if mounts else f"exec {command}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmpdir))
    return subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, env=env, timeout=DEADLINE_S)


@pytest.fixture
def data(runs, tmp_path) -> Path:
    dst = tmp_path / "data"
    copy_run(runs, "rounds", dst)
    return dst


@pytest.fixture
def expected(data, tmp_path) -> str:
    """The answer with derived state kept as usual (then deleted: the tests start with none)."""
    r = run_cli(["--data", str(data), "sql", QUERY, "--csv"], tmp_path)
    assert r.returncode == 0, r.stderr
    import shutil

    shutil.rmtree(data / "derived")
    return r.stdout


def _tmpdir(tmp_path: Path, name: str = "tmp") -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o1777)  # (as /tmp: a user without write access to the data may write here)
    return path


def _left(tmpdir: Path) -> list[str]:
    return [p.name for p in tmpdir.iterdir() if p.name.startswith(FALLBACK_PREFIX)]


@pytest.mark.slow
def test_a_read_only_data_directory_answers_and_leaves_no_copy_behind(data, expected, tmp_path):
    """Finding 5: each reading process left a full copy of the state in the temporary directory."""
    tmpdir = _tmpdir(tmp_path)
    stale = tmpdir / f"{FALLBACK_PREFIX}4194305-gone"  # a killed reader's (above any pid_max): swept
    stale.mkdir()
    read_only = stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    everything = [data, *data.rglob("*")]
    for path in everything:
        path.chmod(read_only if path.is_dir() else read_only & ~0o111)
    try:
        # Root ignores permission bits; in a user namespace of its own it cannot override them.
        prefix = ["unshare", "--user"] if os.geteuid() == 0 else []
        for command in (["sql", QUERY, "--csv"], ["audit", "rounds"], ["paths", "rounds"]):
            r = run_cli(["--data", str(data), *command], tmpdir, prefix)
            assert r.returncode == 0 and "Traceback" not in r.stderr, (command, r.stderr)
            assert r.stderr.count("note: cannot keep derived state in") == 1, r.stderr
            assert "removed when it ends" in r.stderr
            if command[0] == "sql":
                assert r.stdout == expected
            assert _left(tmpdir) == [], command
    finally:
        for path in everything:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert not (data / "derived").exists()


@pytest.fixture
def namespaces() -> list[str]:
    """A user and mount namespace of the test's own, where it may mount a small tmpfs (a full disk)."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail(f"unshare --user --map-root-user --mount is refused here: {probe.stderr.decode()}")
    return ["unshare", "--user", "--map-root-user", "--mount"]


@pytest.mark.slow
def test_a_full_disk_answers_from_a_temporary_state_removed_at_the_end(data, expected, tmp_path, namespaces):
    """Finding 4: on a full disk the probe (an empty file) succeeded, then the state's write failed with a
    traceback. The real write is the probe: the state goes to the temporary directory instead."""
    (data / "derived").mkdir()
    tmpdir = _tmpdir(tmp_path)
    mounts = f"mount -t tmpfs -o size=48k none {shlex.quote(str(data / 'derived'))} &&"
    for command in (["sql", QUERY, "--csv"], ["export", "rounds", "--out", str(tmp_path / "out")]):
        r = run_cli(["--data", str(data), *command], tmpdir, namespaces, mounts)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (command, r.stderr)
        assert "note: cannot keep derived state in" in r.stderr and "No space left on device" in r.stderr
        if command[0] == "sql":
            assert r.stdout == expected
        assert _left(tmpdir) == []
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_a_full_disk_and_a_full_temporary_directory_answer_from_memory(data, expected, tmp_path, namespaces):
    (data / "derived").mkdir()
    tmpdir = _tmpdir(tmp_path)
    mounts = " ".join(f"mount -t tmpfs -o size=48k none {shlex.quote(str(d))} &&" for d in (data / "derived", tmpdir))
    r = run_cli(["--data", str(data), "sql", QUERY, "--csv"], tmpdir, namespaces, mounts)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == expected
    kept = re.search(r"is kept in (/dev/shm/\S+) for this process only", r.stderr)
    assert kept, r.stderr
    assert not Path(kept[1]).exists()
