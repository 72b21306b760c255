"""A campaign's file (``campaign CAMPAIGN.toml``): its tasks, one budget and a policy.

Recorded whole in the campaign log's ``RunStarted`` (docs/CAMPAIGNS.md explains every key)::

    policy = "coverage"            # or "fixed"
    parallel = 8                   # turns at once, shared by every task's run

    [budget]                       # coverage: valid edges, tokens, or both
    edges = 600
    tokens = 40_000_000

    [coverage]                     # the policy's choices (docs/DECISIONS.md)
    first_pass_edges = 4
    first_pass_roots = 30          # optional: roots a task opens first (default all)
    first_pass_probe = true        # with a token budget: one root a task first, to learn the cost
    block_edges = 4
    blocks_per_round = 16

    [explore]                      # every task's run config (explore's --config keys)
    backend = "sim"
    selection = { num_roots = 30 }

    [[tasks]]
    name = "kernel-speedup"
    source = "runs/kernel/all_snapshots"   # an all_snapshots dir or a CORAL run
    direction = "maximize"                 # optional: the source's CORAL config
    coral_dir = "runs/kernel/.coral"       # optional (opencode)
    backend_options = { hard_share = 0.3 } # optional, over [explore]'s
    explore = { seed = 3 }                 # optional, any explore key, over [explore]'s
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.config import GrantsConfig, RunConfig, _merge, parallel_problem, problems
from ingest.errors import InputError

TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TaskSpec(_Strict):
    """One task: explored by a run of its own, ``<campaign>-<name>``."""

    name: str
    source: str
    direction: Literal["maximize", "minimize"] | None = None
    coral_dir: str | None = None
    backend_options: dict[str, Any] = Field(default_factory=dict)
    explore: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _named(self) -> TaskSpec:
        if not TASK_NAME_RE.match(self.name) or ".." in self.name:
            raise ValueError(
                f"task name {self.name!r}: use ASCII letters, digits, '_', '-' and '.' (it names the task's run)"
            )
        if not self.source:
            raise ValueError(f"task {self.name!r}: source must not be empty")
        return self


class Budget(_Strict):
    """What the whole campaign may spend: valid edges (kept), tokens, or both (whichever runs out first)."""

    edges: int | None = Field(None, ge=1, le=10**12)
    tokens: int | None = Field(None, ge=1, le=10**18)


class CoverageOptions(_Strict):
    """The coverage policy's choices (docs/DECISIONS.md, "Campaigns")."""

    first_pass_edges: int = Field(4, ge=1, le=10_000)  # valid edges each root of the first pass gets
    # Roots of each task the first pass opens (None: all), spread evenly over the task's
    # roots in tree order (the Student run's time order); the others are opened later by
    # a block, when their expected gain (the run's yield so far) is the largest.
    first_pass_roots: int | None = Field(None, ge=1, le=100_000)
    # With a token budget, round 0 opens only the first of each task's first-pass roots: what
    # an edge costs is unknown until then. Round 1 gives the rest of the first pass the blocks
    # the tokens left pay for, at the cost seen. (A log recorded before this key ran without.)
    first_pass_probe: bool = True
    block_edges: int = Field(4, ge=1, le=10_000)  # valid edges in each later block
    blocks_per_round: int = Field(16, ge=1, le=100_000)  # blocks a round hands out (one a tree at most)
    flagged_weight: float = Field(0.25, ge=0, le=1)  # a root outside the learnability band weighs this


class CampaignConfig(_Strict):
    """Everything a campaign is configured with; recorded in its log's first event."""

    policy: Literal["fixed", "coverage"]
    parallel: int = Field(4, ge=1)
    budget: Budget = Budget()
    coverage: CoverageOptions = CoverageOptions()
    explore: dict[str, Any] = Field(default_factory=dict)
    tasks: list[TaskSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> CampaignConfig:
        names = [t.name for t in self.tasks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tasks named more than once: {', '.join(twice)}")
        # Each name names a run's directory (task_run_id): two that differ only in case are one
        # directory on a case-insensitive file system.
        alike: dict[str, list[str]] = {}
        for n in names:
            alike.setdefault(n.casefold(), []).append(n)
        clashes = [" and ".join(repr(n) for n in group) for group in alike.values() if len(group) > 1]
        if clashes:
            raise ValueError(
                f"tasks whose names differ only in case: {'; '.join(clashes)} (each names its run's directory, "
                "and those are one on a case-insensitive file system): rename one"
            )
        has_budget = self.budget.edges is not None or self.budget.tokens is not None
        if self.policy == "coverage" and not has_budget:
            raise ValueError("policy coverage needs a budget: [budget] edges, tokens or both")
        if self.policy == "fixed" and has_budget:
            raise ValueError(
                "policy fixed grows every tree by its task's own rules (tree.max_valid_edges, "
                "target_good_leaves) and takes no [budget]: set those under [explore], or use policy coverage"
            )
        return self

    def task(self, name: str) -> TaskSpec:
        """The task named ``name`` (a campaign's log records only the tasks its file lists)."""
        return next(t for t in self.tasks if t.name == name)

    def run_config(self, task: TaskSpec, campaign: str) -> RunConfig:
        """The config of ``task``'s run: [explore], the task's own keys over it (a campaign's coverage
        policy adds its grants)."""
        data = _merge(self.explore, task.explore)
        data = _merge(data, {"task": task.name, "backend_options": task.backend_options})
        if task.direction:
            data["direction"] = task.direction
        if task.coral_dir:
            data = _merge(data, {"backend_options": {"coral_dir": task.coral_dir}})
        if self.policy == "coverage":
            data["grants"] = GrantsConfig(
                campaign=campaign, block_edges=self.coverage.block_edges, flagged_weight=self.coverage.flagged_weight
            ).model_dump()
        try:
            return RunConfig.model_validate(data)
        except ValidationError as err:
            raise InputError(f"task {task.name!r}: invalid explore configuration ({problems(err)})") from err


def load_campaign(path: Path, parallel: int | None = None) -> CampaignConfig:
    """The campaign of a TOML file (``parallel``: the shared slots, over the file's), every task's run config checked.

    A task's relative ``source`` and ``coral_dir`` are relative to the file's directory.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise InputError(f"{path}: cannot read the campaign file ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte {err.start}); TOML files are UTF-8") from err
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: invalid TOML ({err})") from err
    if parallel is not None:
        data["parallel"] = parallel
    base = path.resolve().parent
    for task in data.get("tasks", []) if isinstance(data.get("tasks"), list) else []:
        for key in ("source", "coral_dir"):
            if isinstance(task, dict) and isinstance(task.get(key), str) and task[key]:
                task[key] = str((base / task[key]).resolve()) if not Path(task[key]).is_absolute() else task[key]
    try:
        config = CampaignConfig.model_validate(data)
    except ValidationError as err:
        raise InputError(f"{path}: invalid campaign ({problems(err)})") from err
    problem = parallel_problem(config.parallel)
    if problem:
        raise InputError(f"{path}: invalid campaign (parallel: {problem})")
    for task in config.tasks:
        try:
            config.run_config(task, "check")
        except InputError as err:
            raise InputError(f"{path}: {err}") from err
    return config
