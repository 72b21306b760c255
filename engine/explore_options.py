"""explore's command line: its options as a run's configuration (what a new run sets, what a resume
may change), and a run started or resumed from them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.config import RunConfig, load_config
from engine.process import continue_with
from ingest.errors import InputError, OptionError
from ingest.paths import command_line

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
        f"continues the run as its log records it: {', '.join(fixed)} cannot change (the run keeps "
        "its recorded value); a resume may change only --parallel, --turn-timeout, --executor and --ray-address"
    )


def explore_from_command_line(
    data_dir: Path,
    roots: Path | None,
    run_id: str | None,
    resume_id: str | None,
    config_file: Path | None,
    options: dict[str, Any],
    *,
    progress: Any,
    echo: Callable[[str], None],
) -> Any:
    """The ``explore`` command: a new run of ``roots`` (``options["select"]``: select them first), or
    a resume of ``resume_id``; its lines to ``echo``. Options that do not go together: OptionError."""
    options = dict(options)
    select = options.pop("select")
    where = {"executor": options.pop("executor"), "ray_address": options.pop("ray_address")}
    if resume_id:
        if roots is not None or run_id or select:
            raise OptionError("--resume", "takes no ROOTS, --run-id or --select")
        return _resume(data_dir, resume_id, config_file, options, where, progress, echo)
    if roots is None:
        raise OptionError("ROOTS", "is required (or --resume RUN_ID)")
    if select and not options.get("task"):
        raise OptionError("--select", "needs --task")
    from engine.exploration import new_run
    from engine.roots import DirectionConflict, DirectionError

    config = new_run_config(config_file, options)

    def started(rid: str, run: RunConfig) -> None:
        hint = command_line(data_dir, "explore", "--resume", rid)
        echo(f"run {rid}: exploring task {run.task} ({run.direction}); interrupt and continue with: {hint}")
        continue_with(hint)

    try:
        return new_run(data_dir, roots, config, run_id, select, on_progress=progress, on_start=started, **where)
    except DirectionConflict as err:  # where the direction was given
        raise err.said_as("--direction" if options.get("direction") else f"the direction in {config_file}") from err
    except DirectionError:  # (not a question of selecting first)
        raise
    except InputError as err:  # about the folders of ROOTS: they may be ones to select from
        if select or not roots.is_dir() or not str(err).startswith(f"{roots}: "):
            raise
        raise InputError(
            f"{err} (ROOTS is the output of select-snapshots; to select the roots "
            "from a task's all_snapshots dir or a CORAL run first, add --select "
            "--task NAME)"
        ) from err


def _resume(
    data_dir: Path,
    run_id: str,
    config_file: Path | None,
    options: dict[str, Any],
    where: dict[str, Any],
    progress: Any,
    echo: Callable[[str], None],
) -> Any:
    from engine import outputs
    from engine.exploration import resume_run

    if problem := resume_problem(options, config_file):
        raise OptionError("--resume", problem)
    continue_with(command_line(data_dir, "explore", "--resume", run_id))
    return resume_run(
        data_dir,
        run_id,
        on_progress=progress,
        on_start=lambda p: echo(outputs.resuming(run_id, p)),
        parallel=options["parallel"],
        turn_timeout=options["turn_timeout"],
        **where,
    )
