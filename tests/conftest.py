"""Shared fixtures: temporary data dirs, snapshot folders and catalogs built from events."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.catalog import Catalog  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from ingest.events import Event, RunStarted, to_arrow  # noqa: E402


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def make_snapshot(
    root: Path,
    index: int,
    agent: str = "agent-1",
    score: object = 1.0,
    eval_ok: object = True,
    commit: str | None = None,
    with_eval_ok: bool = True,
    attempt_name: str | None = None,
    attempt: dict | None = None,
) -> Path:
    """One CORAL-style snapshot folder with its attempt JSON."""
    commit = commit or f"{index:08x}" + "ab" * 16
    folder = root / f"eval-{index:06d}-{agent}-{commit[:12]}"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "solution.py").write_text(f"VALUE = {index}\n")
    (folder / "shared" / "attempts").mkdir(parents=True)
    meta = {"commit_hash": commit, "eval_count": index, "agent_id": agent}
    if with_eval_ok:
        meta["eval_ok"] = eval_ok
    (folder / "metadata.json").write_text(json.dumps(meta))
    body = attempt if attempt is not None else {
        "commit_hash": commit, "agent_id": agent, "score": score, "status": "improved",
    }
    name = attempt_name or f"{commit}.json"
    (folder / "shared" / "attempts" / name).write_text(json.dumps(body, allow_nan=True))
    return folder


def catalog_of(events: list[Event], config: RunConfig | None = None) -> Catalog:
    """A catalog over a run whose log is RunStarted(config) followed by ``events``."""
    config = config or RunConfig()
    started = RunStarted(
        command="test", task=config.task, direction=config.direction or "maximize",
        config=config.model_dump(mode="json"),
    )
    catalog = Catalog.empty()
    catalog.insert(to_arrow([started, *events], "test-run", 1, datetime.now(UTC)))
    return catalog
