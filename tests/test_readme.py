"""README's commands run as README shows them, and the documentation's links resolve.

The commands are the fenced ``bash`` blocks of README.md, run in one bash session in a
temporary copy of the checkout (its files as git lists them), so that ``./data`` is the
copy's and nothing is written into the checkout. ``python`` is the interpreter running
the tests (a wrapper of that name first on ``PATH``); the commands are not rewritten.
A ``text`` block right after a ``bash`` block is what those commands print: each of its
lines must appear in their output, in order (``…`` stands for anything; a line of only
``…`` for lines left out).

Not run: the virtual environment (it would replace the interpreter under test with an
empty one), the install of the main job (``pip install -e .``: the test runs in the
installed environment, so only the exploration after the ``&&`` runs), the test command
(``.ci/run`` runs it; tests/test_conventions.py checks the two are the same line) and the
real run (it needs a model server and a Student's CORAL run).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
MAX_README_LINES = 250
INSTALL = "python -m pip install -e . && "
NOT_RUN = {
    "python -m venv venv && . venv/bin/activate": "the virtual environment",
    (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]: "the test command (.ci/run)",
}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a Markdown text, in order: (language, body)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)\s*$", lines[i])
        if opening:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append((opening.group(1), "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def readme_commands() -> list[tuple[str, str | None]]:
    """README's bash blocks that the test runs, each with the text block shown after it (or None)."""
    blocks = fenced_blocks(README.read_text())
    runs = []
    for k, (language, body) in enumerate(blocks):
        if language != "bash" or body in NOT_RUN or "--backend opencode" in body:
            continue
        if body.startswith(INSTALL):
            body = body[len(INSTALL) :]  # the main job, without its install
        expected = blocks[k + 1][1] if k + 1 < len(blocks) and blocks[k + 1][0] == "text" else None
        runs.append((body, expected))
    return runs


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail under docs/"


def test_the_readme_shows_the_main_job_and_the_walk_after_it():
    """The commands the slow test runs: the main job's exploration first, then the walk."""
    bodies = [body for body, _ in readme_commands()]
    main = "python cli.py explore data/student_run/all_snapshots --select --task kernel-speedup --parallel 16"
    assert bodies[0] == main
    shown = "\n".join(bodies)
    for command in ("replay", "paths", "audit", "report", "export"):
        assert f"python cli.py {command} " in shown, command
    blocks = [body for language, body in fenced_blocks(README.read_text()) if language == "bash"]
    assert INSTALL + main in blocks  # the install is the only part not run


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (code blocks left out)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        heading = None if inside else re.match(r"^#{1,6} (.*)$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def links(text: str) -> list[str]:
    """The targets of a Markdown text's links and images, outside code."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(([^)\s]+)\)", prose)


DOCUMENTS = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in links(document.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and anchor not in github_anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert broken == []


def test_the_picture_of_a_tree_is_small():
    picture = ROOT / "docs" / "img" / "report-tree.png"
    assert "docs/img/report-tree.png" in README.read_text()
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size < 200_000


def copy_checkout(to: Path) -> None:
    """The checkout's files as git lists them (tracked, and new ones not ignored)."""
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet staged is listed too
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def expect_in_order(expected: str, output: str) -> list[str]:
    """The lines of ``expected`` that ``output`` does not show in that order ([] when all are)."""
    lines = [line.rstrip() for line in output.splitlines()]
    at, missing = 0, []
    for want in expected.splitlines():
        if not want.strip() or want.strip() == "…":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.rstrip().split("…")))
        found = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            missing.append(want)
        else:
            at = found + 1
    return missing


@pytest.mark.slow
def test_the_readme_commands_run_as_shown(tmp_path):
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    copy_checkout(checkout)
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TEACHER_MCTS_DATA"}  # the default ./data
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    commands = readme_commands()
    script = "set -euo pipefail\n"
    script += "".join(f"echo '@@ block {k} @@'\n{body}\n" for k, (body, _) in enumerate(commands))
    runs_before = sorted(os.listdir(ROOT / "data" / "runs")) if (ROOT / "data" / "runs").exists() else None

    done = subprocess.run(
        ["bash", "-c", script],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1200,
    )

    assert done.returncode == 0, done.stdout[-4000:]
    outputs = re.split(r"^@@ block \d+ @@\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(commands)
    for (body, expected), output in zip(commands, outputs, strict=True):
        if expected is not None:
            assert expect_in_order(expected, output) == [], f"{body}\n---\n{output[-3000:]}"
    assert "Traceback" not in done.stdout
    assert '<svg class="tree"' in (checkout / "data" / "out" / "report.html").read_text()
    assert (checkout / "data" / "out" / "train" / "manifest.json").exists()
    runs_after = sorted(os.listdir(ROOT / "data" / "runs")) if (ROOT / "data" / "runs").exists() else None
    assert runs_after == runs_before  # nothing written into the checkout's data
