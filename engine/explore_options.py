"""explore's command-line options as a run's configuration: what a new run sets, what a resume may change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import RunConfig, load_config

RESUMABLE = ("parallel", "turn_timeout")  # how the run is deployed, not what it decides (DECISIONS.md)
OPENCODE_OPTIONS = {
    "model": "model",
    "endpoint": "endpoint",
    "api_key_env": "api_key_env",
    "eval_command": "eval_command",
    "turn_timeout": "turn_timeout_s",
    "worktrees": "worktree_root",
    "coral_dir": "coral_dir",
}


def new_run_config(config_file: Path | None, options: dict[str, Any]) -> RunConfig:
    """The config of a new run: the TOML file's, with the options given (None: not given) over it."""
    return load_config(config_file, overrides(**options))


def overrides(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: kw[k] for k in ("backend", "parallel", "schedule", "seed", "direction", "task") if kw.get(k) is not None
    }
    if kw.get("num_roots") is not None:
        out["selection"] = {"num_roots": kw["num_roots"]}
    backend = {opt: kw[key] for key, opt in OPENCODE_OPTIONS.items() if kw.get(key) is not None}
    if kw.get("no_grader_check"):
        backend["grader_check"] = False
    if backend:
        out["backend_options"] = backend
    return out


def resume_problem(options: dict[str, Any], config_file: Path | None) -> str | None:
    """What is wrong with the options given to a resume: those it cannot change (the run keeps what its log records)."""
    fixed = [
        f"--{name.replace('_', '-')}" for name, value in options.items() if value is not None and name not in RESUMABLE
    ]
    fixed += ["--config"] if config_file else []
    if not fixed:
        return None
    return (
        f"--resume continues the run as its log records it: {', '.join(fixed)} cannot change (the run keeps "
        "its recorded value); a resume may change only --parallel, --turn-timeout, --executor and --ray-address"
    )
