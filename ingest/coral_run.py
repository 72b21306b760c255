"""A CORAL run directory as a source of roots: every attempt is a candidate snapshot (ALGORITHM §1).

CORAL writes no snapshot folders. A run directory holds ``.coral/`` (its shared
state) and ``repo/`` (the agents' branches); each attempt JSON in
``.coral/public/attempts/`` gives one ``SnapshotSeen`` fact, as a snapshot folder
does: its code is the attempt's commit in the repository, its shared dir the
checkpoint of ``public/`` (the git repository CORAL keeps in ``public/.git``) at
the attempt's ``shared_state_hash``, its metadata the attempt itself. ``eval_ok``
is "graded with a numeric score" (absent while pending, as in a snapshot folder).

The global order is CORAL's grading order: the daemon grades pending attempts
oldest submission first, so attempts are numbered by their ``timestamp`` (the
submission time; ties by commit). ``eval_count`` is the number of graded attempts
up to and including one. A picked attempt is written out as an ordinary snapshot
folder by ``export``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.errors import InputError
from ingest.events import SnapshotSeen
from ingest.snapshots import grader_direction, numeric_score

HEX = re.compile(r"^[0-9a-fA-F]{7,64}$")
# What CORAL's processes keep at the top of ``public/`` while a run is live (pid files,
# heartbeats, the agents' logs and sessions, the gateway's): its checkpoints hold them,
# but they are no shared knowledge. A root's ``shared/`` and every copy of a shared dir
# (engine.teachers.opencode.worktrees.copy_dir) leave them out.
RUNTIME = frozenset(
    {
        "manager.pid",
        "agent.pids",
        "agent_pids.json",
        "agent_state.json",
        "grader_daemon.pid",
        "grader_daemon_heartbeat",
        "ui.pid",
        "sessions.json",
        "sessions",
        "heartbeat",
        "logs",
        "diagnostics",
        "gateway",
        ".gitignore",
    }
)


def find_coral(path: Path) -> Path | None:
    """The ``.coral`` of a CORAL run directory (``path`` may be the ``.coral`` itself), else None."""
    path = Path(path)
    for coral in (path / ".coral", path):
        if (coral / "public" / "attempts").is_dir() and (coral / "config.yaml").is_file():
            return coral.resolve()
    return None


def direction(coral: Path) -> str | None:
    """``grader.direction`` of the run's ``config.yaml``."""
    return grader_direction(coral / "config.yaml")


def repository(coral: Path) -> Path:
    """The run's code repository: ``<run>/repo``, else the run directory if it is one (as CORAL looks)."""
    for candidate in (coral.parent / "repo", coral.parent):
        if candidate.is_dir() and (candidate / ".git").exists():
            return candidate
    raise InputError(f"{coral.parent}: a CORAL run without its repository (no repo/ with a .git)")


def scan(source: Path, task: str) -> list[SnapshotSeen]:
    """One fact per attempt file of the CORAL run ``source``, in the run's order (skipped ones after)."""
    coral = find_coral(source)
    if coral is None:
        raise InputError(f"{source}: not a CORAL run (no .coral/public/attempts and .coral/config.yaml)")
    # (CORAL writes an attempt as .<hash>.*.json.tmp first, then renames it.)
    files = sorted(
        p for p in (coral / "public" / "attempts").iterdir() if p.suffix == ".json" and not p.name.startswith(".")
    )
    if not files:
        raise InputError(f"{coral / 'public' / 'attempts'}: the CORAL run has no attempts yet")
    repo = repository(coral)
    skipped: list[SnapshotSeen] = []
    ordered: list[tuple[datetime, str, Path, dict[str, Any]]] = []
    for path in files:
        attempt, problem = _read(path)
        if problem:
            skipped.append(
                SnapshotSeen(task=task, snapshot=path.name, path=str(path), attempt_file=path.name, skip_reason=problem)
            )
        else:
            ordered.append((_instant(attempt["timestamp"]), attempt["commit_hash"], path, attempt))
    ordered.sort(key=lambda row: (row[0], row[1]))
    in_repo = _commits_present(repo, [a["commit_hash"] for *_, a in ordered])
    facts, graded = [], 0
    for i, ((_, _, path, attempt), shared, has_code) in enumerate(
        zip(ordered, _checkpoints(coral / "public", [a for *_, a in ordered]), in_repo, strict=True), start=1
    ):
        pending = attempt.get("status") == "pending"
        graded += not pending
        facts.append(_fact(task, i, path, attempt, graded, pending, repo if not has_code else None, shared))
    return facts + skipped


def _checkpoints(public: Path, attempts: list[dict[str, Any]]) -> list[tuple[str | None, str | None]]:
    """Per attempt (in order): the checkpoint commit of its shared dir, or why there is none.

    An attempt without ``shared_state_hash`` was submitted when ``public/`` had not
    changed since the last checkpoint: the nearest earlier attempt's, else the
    checkpoint repository's first commit.
    """
    if not (public / ".git").exists():
        return [(None, "the run keeps no checkpoint repository public/.git")] * len(attempts)
    hashes = [a.get("shared_state_hash") if isinstance(a.get("shared_state_hash"), str) else None for a in attempts]
    present = _commits_present(public, [h or "-" for h in hashes])
    out, last = [], _first_commit(public)
    for h, ok in zip(hashes, present, strict=True):
        if h is None:
            out.append((last, None if last else "public/.git has no commit"))
        elif ok:
            last = h
            out.append((h, None))
        else:
            out.append((None, f"checkpoint {h[:12]} is not in public/.git"))
    return out


def _fact(
    task: str,
    index: int,
    path: Path,
    attempt: dict[str, Any],
    graded: int,
    pending: bool,
    missing_from: Path | None,
    shared: tuple[str | None, str | None],
) -> SnapshotSeen:
    commit, agent = attempt["commit_hash"], attempt["agent_id"]
    score, problem = numeric_score(attempt.get("score"))
    status = attempt.get("status") if isinstance(attempt.get("status"), str) else None
    base: dict[str, Any] = {
        "task": task,
        "snapshot": f"eval-{index:06d}-{agent}-{commit[:12]}",
        "path": str(path),
        "global_index": index,
        "agent_id": agent,
        "short_hash": commit[:12],
        "commit_hash": commit,
        "attempt_file": path.name,
        "attempt_status": status,
        "shared_state_hash": shared[0],
    }
    if pending:
        return SnapshotSeen(**base, skip_reason="pending: the attempt is not graded yet")
    eval_ok = score is not None
    base.update(eval_count=graded, eval_ok=eval_ok, eval_ok_json=json.dumps(eval_ok))
    if missing_from is not None:
        return SnapshotSeen(**base, skip_reason=f"missing code/ (commit {commit[:12]} is not in {missing_from})")
    if shared[1] is not None:
        return SnapshotSeen(**base, skip_reason=f"missing shared/ ({shared[1]})")
    return SnapshotSeen(**base, score=score, score_problem=problem)


def _read(path: Path) -> tuple[dict[str, Any], str | None]:
    """The attempt, or why it cannot be placed in the run (it is skipped with that reason)."""
    try:
        attempt = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        return {}, f"unreadable attempt file ({err.strerror or err})"
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return {}, f"invalid JSON in the attempt file ({err})"
    if not isinstance(attempt, dict):
        return {}, "the attempt file is not a JSON object"
    commit, agent, stamp = attempt.get("commit_hash"), attempt.get("agent_id"), attempt.get("timestamp")
    if not (isinstance(commit, str) and HEX.match(commit)):
        return {}, "the attempt has no commit_hash"
    if not (isinstance(agent, str) and agent and "/" not in agent):
        return {}, "the attempt has no agent_id"
    if not isinstance(stamp, str) or _instant(stamp) is None:
        return {}, "the attempt has no ISO-8601 timestamp (its place in the run is unknown)"
    return attempt, None


def _instant(stamp: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _commits_present(repo: Path, refs: list[str]) -> list[bool]:
    """Whether each ref names a commit of ``repo`` (one ``git cat-file --batch-check`` for all)."""
    if not refs:
        return []
    lines = "".join(f"{r}^{{commit}}\n" if HEX.match(r) else "-\n" for r in refs)
    done = subprocess.run(["git", "cat-file", "--batch-check"], cwd=repo, input=lines, capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"{repo}: git cannot read the repository ({done.stderr.strip()})")
    return [not line.endswith("missing") and " commit " in line for line in done.stdout.splitlines()]


def _first_commit(repo: Path) -> str | None:
    done = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=repo, capture_output=True, text=True)
    roots = done.stdout.split()
    return roots[-1] if done.returncode == 0 and roots else None


def export(pick: dict[str, Any], dest: Path) -> None:
    """Write the picked attempt ``pick`` (a ``snapshots`` row) as a snapshot folder ``dest``.

    ``code/`` is the commit's tree, ``shared/`` the checkpoint's tree without CORAL's
    runtime files (``RUNTIME``) plus the graded attempt itself (the state right after
    its eval returned), and
    ``metadata.json`` the attempt's fields; the run's ``config.yaml`` goes along
    as ``coral_config.yaml`` (its ``grader.direction`` is the task's).
    """
    attempt_path = Path(pick["path"])
    coral = attempt_path.parents[2]
    dest.mkdir(parents=True)
    _extract(repository(coral), pick["commit_hash"], dest / "code")
    _extract(coral / "public", pick["shared_state_hash"], dest / "shared")
    for name in RUNTIME:
        found = dest / "shared" / name
        if found.is_dir() and not found.is_symlink():
            shutil.rmtree(found)
        else:
            found.unlink(missing_ok=True)
    (dest / "shared" / "attempts").mkdir(exist_ok=True)
    shutil.copyfile(attempt_path, dest / "shared" / "attempts" / f"{pick['commit_hash']}.json")
    shutil.copyfile(coral / "config.yaml", dest / "coral_config.yaml")
    attempt = json.loads(attempt_path.read_text())
    meta = {
        "commit_hash": pick["commit_hash"],
        "eval_count": pick["eval_count"],
        "agent_id": pick["agent_id"],
        "eval_ok": pick["eval_ok"],
        "status": attempt.get("status"),
        "title": attempt.get("title"),
        "timestamp": attempt.get("timestamp"),
        "shared_state_hash": pick["shared_state_hash"],
        "coral_attempt": str(attempt_path),
    }
    (dest / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def _extract(repo: Path, commit: str, dest: Path) -> None:
    """The tree of ``commit`` in ``repo`` written to ``dest`` (``git archive``, read as a tar stream)."""
    dest.mkdir()
    proc = subprocess.Popen(
        ["git", "archive", "--format=tar", commit], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise InputError(f"{repo}: cannot read commit {commit[:12]} ({err.strip()})")
