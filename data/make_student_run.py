"""Generate a CORAL-style Student run as an ``all_snapshots/`` directory.

The bundled ``data/student_run/all_snapshots`` was made with the defaults::

    python data/make_student_run.py data/student_run/all_snapshots

Several agents take turns (round robin with jitter) evaluating attempts on a
"kernel speedup" task; the score follows a noisy logistic learning curve. Every
eval saves a snapshot ``eval-<NNNNNN>-<agent>-<12 hex>/`` holding ``code/`` (the
agent's repository), ``shared/`` (attempts, notes and skills as CORAL keeps them)
and ``metadata.json``. Some evals crash (``eval_ok: false``, null score), a few
time out with a number, and the newest ones are still pending (no ``eval_ok``).

``--attempts-window N`` keeps only the newest N attempts and notes in each
snapshot's ``shared/`` (a real run keeps all; large benchmark corpora need the bound).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

SOLUTION = '''"""Tiled matrix multiply kernel (attempt {n} by {agent})."""

TILE = {tile}
UNROLL = {unroll}
USE_VECTOR = {vector}


def matmul(a, b):
    n, m, p = len(a), len(b), len(b[0])
    out = [[0.0] * p for _ in range(n)]
    for i0 in range(0, n, TILE):
        for k0 in range(0, m, TILE):
            for i in range(i0, min(i0 + TILE, n)):
                row = out[i]
                for k in range(k0, min(k0 + TILE, m)):
                    aik = a[i][k]
                    bk = b[k]
                    for j in range(p):
                        row[j] += aik * bk[j]
    return out
'''

NOTE = """---
creator: {agent}
created: {created}
---
# {title}

{body}
"""

SKILL = """---
name: {name}
description: {description}
---
# {name}

{body}
"""

NOTE_TOPICS = [
    ("Tile size sweep", "Tiles of 32-64 beat 16 on the grader's 512x512 case; 128 spills."),
    ("Unrolling", "Unroll by 4 helps only with the vector path enabled; by 8 regresses."),
    ("Grader noise", "Scores vary by about 0.05 between identical commits; re-run before reverting."),
    ("Memory layout", "Transposing b once up front removes the strided access in the inner loop."),
    ("Dead end: threads", "The grader pins one core; threading only adds overhead."),
    ("Vector path", "USE_VECTOR with TILE=64 gave the first >3x result; keep UNROLL at 4."),
    ("Crash cause", "Out-of-range TILE (0) crashes the grader; clamp it to at least 8."),
    ("Cache blocking", "Two-level blocking (64 then 8) is within noise of one level."),
]

SKILLS = [
    (
        "profile-kernel",
        "Profile the kernel with cProfile before changing tiling",
        "Run `python -m cProfile -s cumtime bench.py` and look at the inner loop share.",
    ),
    (
        "safe-revert",
        "Revert to the best attempt without losing notes",
        "Use `coral log` to find the best commit, then `git checkout <hash> -- solution.py`.",
    ),
]


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _curve(i: int, n: int, rng: random.Random) -> float:
    """A noisy logistic learning curve from about 1.0 up to about 3.6."""
    x = i / max(1, n - 1)
    base = 1.0 + 2.6 / (1.0 + math.exp(-9.0 * (x - 0.45)))
    return round(base + rng.gauss(0.0, 0.12), 4)


def generate(
    out: Path,
    n_snapshots: int = 100,
    agents: int = 4,
    seed: int = 7,
    pending: int = 3,
    crash_rate: float = 0.08,
    attempts_window: int | None = None,
    task: str = "kernel-speedup",
) -> list[dict]:
    """Write the snapshot folders under ``out`` and return their metadata, in order."""
    rng = random.Random(seed)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    start = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
    agent_ids = [f"agent-{k + 1}" for k in range(agents)]
    eval_counts = dict.fromkeys(agent_ids, 0)
    parents: dict[str, str | None] = dict.fromkeys(agent_ids)
    attempts: list[dict] = []
    notes: list[tuple[str, str]] = []
    skills: list[tuple[str, str]] = []
    saved = []
    for i in range(n_snapshots):
        agent = agent_ids[(i + rng.randrange(2)) % agents]
        eval_counts[agent] += 1
        commit = _hex(rng, 40)
        when = start + timedelta(minutes=7 * i + rng.randrange(5))
        is_pending = i >= n_snapshots - pending
        crashed = not is_pending and rng.random() < crash_rate
        timed_out = not is_pending and not crashed and rng.random() < 0.03
        score = None if (is_pending or crashed) else _curve(i, n_snapshots, rng)
        status = (
            "pending"
            if is_pending
            else "crashed"
            if crashed
            else "timeout"
            if timed_out
            else (
                "improved"
                if score
                and attempts
                and score
                > max(
                    (a["score"] for a in attempts if a["agent_id"] == agent and a["score"] is not None),
                    default=0.0,
                )
                else "regressed"
            )
        )
        tile = rng.choice([8, 16, 32, 64, 128]) if not crashed else 0
        attempt = {
            "commit_hash": commit,
            "agent_id": agent,
            "title": f"{agent}: tile={tile} attempt {eval_counts[agent]}",
            "score": score,
            "status": status,
            "parent_hash": parents[agent],
            "timestamp": when.isoformat(),
            "feedback": "" if score is None else f"speedup {score:.3f}x over baseline",
        }
        parents[agent] = commit
        attempts.append(attempt)
        if rng.random() < 0.12:
            title, body = NOTE_TOPICS[len(notes) % len(NOTE_TOPICS)]
            slug = title.lower().replace(" ", "-").replace(":", "")
            notes.append(
                (
                    f"{len(notes) + 1:02d}-{slug}.md",
                    NOTE.format(agent=agent, created=when.isoformat(), title=title, body=body),
                )
            )
        if i in (n_snapshots // 3, (2 * n_snapshots) // 3) and len(skills) < len(SKILLS):
            name, description, body = SKILLS[len(skills)]
            skills.append((name, SKILL.format(name=name, description=description, body=body)))

        folder = out / f"eval-{i + 1:06d}-{agent}-{commit[:12]}"
        code = folder / "code"
        code.mkdir(parents=True)
        (code / "solution.py").write_text(
            SOLUTION.format(
                n=eval_counts[agent],
                agent=agent,
                tile=tile,
                unroll=rng.choice([1, 2, 4, 8]),
                vector=rng.random() < i / n_snapshots,
            )
        )
        shared = folder / "shared"
        (shared / "attempts").mkdir(parents=True)
        visible = attempts if attempts_window is None else attempts[-attempts_window:]
        for a in visible:
            (shared / "attempts" / f"{a['commit_hash']}.json").write_text(json.dumps(a, separators=(",", ":")) + "\n")
        if notes:
            (shared / "notes").mkdir()
            for name, text in notes if attempts_window is None else notes[-attempts_window:]:
                (shared / "notes" / name).write_text(text)
        for name, text in skills:
            (shared / "skills" / name).mkdir(parents=True, exist_ok=True)
            (shared / "skills" / name / "SKILL.md").write_text(text)
        metadata = {"commit_hash": commit, "eval_count": eval_counts[agent], "agent_id": agent}
        if not is_pending:
            metadata["eval_ok"] = score is not None and not timed_out
        (folder / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        saved.append({"folder": folder.name, "task": task, **metadata, "score": score})
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the all_snapshots directory to (re)create")
    parser.add_argument("--snapshots", type=int, default=100)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pending", type=int, default=3)
    parser.add_argument("--attempts-window", type=int, default=None)
    args = parser.parse_args()
    saved = generate(
        args.out, args.snapshots, args.agents, args.seed, args.pending, attempts_window=args.attempts_window
    )
    print(f"wrote {len(saved)} snapshots to {args.out}")


if __name__ == "__main__":
    main()
