"""The ``opencode`` backend's options (TOML ``[backend_options]``): their model, defaults and checks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config import problems
from engine.teachers.opencode.coral import coral_python, student_coral_dir
from ingest.errors import InputError

TURN1 = (
    'You are improving this repository for the task "{task}". Shared knowledge from earlier '
    "attempts by other agents is in `.opencode/` (notes/, skills/, attempts/): read what helps, "
    "and write a note about what you learn. Make one focused improvement, check it locally, then "
    'finish this attempt by running `{eval_command} "<one-line summary of the change>"`.'
)
TURN2 = (
    "Read the eval result of your last attempt and make a further improvement, then finish "
    'again by running `{eval_command} "<one-line summary of the change>"`.'
)


class GraderTolerance(BaseModel):
    """How far the grader's score of a root may be from the recorded one:
    ``absolute + relative * |recorded|`` (a timing grader varies by a few percent)."""

    model_config = ConfigDict(extra="forbid")

    relative: float = Field(0.05, ge=0, allow_inf_nan=False)
    absolute: float = Field(1e-6, ge=0, allow_inf_nan=False)


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
    turn_timeout_s: float = Field(1800.0, gt=0, description="a turn's work: from its first request to the model")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="with an endpoint: from a turn's start to its first request to the model"
    )
    prompt_turn1: str = TURN1
    prompt_turn2: str = TURN2
    worktree_root: str | None = None
    shared_dir: str = ".opencode"
    attempts_subdir: str = "attempts"
    coral_dir: str | None = Field(None, description="the Student run's .coral: grade in a CORAL run per edge")
    coral_agent_id: str = Field("teacher", pattern=r"^[A-Za-z0-9_.-]+$")
    coral_python: str | None = Field(None, description="the Python CORAL is installed in (default: coral's)")
    node_store: str | None = Field(
        None,
        description="cluster nodes: where each keeps OpenCode's store (a local disk; default: the temporary directory)",
    )
    serve: bool = Field(
        True,
        description="drive turns through one long-lived `opencode serve` of the store (false: an `opencode run` "
        "process a turn)",
    )
    server_width: int | None = Field(
        None,
        ge=1,
        description="turns one server runs at once (more start another); default: sized by the machine "
        "(sized_width: --parallel spread over one server a core, at most 16 a server)",
    )
    server_turns: int = Field(200, ge=1, description="turns a server takes before a new one replaces it")
    turn_memory_mb: int | None = Field(
        None,
        ge=1,
        description="the memory one concurrent turn takes here (OpenCode, its tools, the grader daemon): "
        "--parallel is refused beyond what the machine carries (default: 300 served, 800 with a process a turn)",
    )
    grader_check: bool = Field(True, description="with coral_dir: grade a root's own code before the first turn")
    grader_check_tolerance: GraderTolerance = GraderTolerance()


MAX_WIDTH = 16  # one server given 64 new instances at once stalled (server.Servers)


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def sized_width(parallel: int, explicit: int | None = None, cores: int | None = None) -> int:
    """Turns one ``opencode serve`` carries: ``explicit`` when set, else the run's ``parallel`` turns
    spread over one server a core (a server is one event loop: one carrying every turn left the
    other core idle), at most ``MAX_WIDTH`` a server (benchmarks/README.md, issue 53)."""
    if explicit is not None:
        return explicit
    cores = cores or machine_cores()
    return max(1, min(MAX_WIDTH, -(-parallel // cores)))


def resolve_options(options: dict[str, Any]) -> dict[str, Any]:
    """Validated backend options with defaults, safe to record (no secret values)."""
    for key in ("api_key", "apiKey"):
        if key in options:
            raise InputError(
                f"backend_options.{key}: do not put the key in the config; "
                "put it in an environment variable and set api_key_env"
            )
    try:
        opts = OpenCodeOptions.model_validate(options)
    except ValidationError as err:
        raise InputError(f"opencode backend options: {problems(err)}") from err
    if opts.worktree_root is not None:  # recorded absolute: a resume may start elsewhere
        opts = opts.model_copy(update={"worktree_root": str(Path(opts.worktree_root).resolve())})
    if opts.coral_dir is not None:  # recorded absolute, with the Python its daemon runs in
        check_eval_command(opts.eval_command)
        opts = opts.model_copy(
            update={
                "coral_dir": str(student_coral_dir(opts.coral_dir)),
                "coral_python": coral_python(opts.eval_command, opts.coral_python),
            }
        )
    return opts.model_dump()


def check_eval_command(command: str) -> None:
    """Refuse a run whose turns could not run the eval command at all (not on PATH).

    A command given as a path relative to the worktree cannot be checked here.
    """
    words = command.split()
    if not words:
        raise InputError("--eval-command is empty")
    word = words[0]
    if "/" in word:
        if Path(word).is_absolute() and not os.access(word, os.X_OK):
            raise InputError(f"the eval command {command!r} cannot run: {word} is not an executable file")
        return
    if shutil.which(word) is None:
        msg = (
            f"the eval command {command!r} cannot run: {word!r} is not on PATH - install "
            "CORAL (or the grader's command line) there, or set --eval-command"
        )
        raise InputError(msg)
