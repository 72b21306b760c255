"""Run configuration: every parameter and weight, recorded whole in ``RunStarted``.

The defaults are ALGORITHM §2-§4's. Views read the recorded values through the view
``run_config``; nothing in Python or SQL assumes a default that is not written here.
"""

from __future__ import annotations

import json
import resource
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ingest.columns import fits_int64
from ingest.errors import InputError, LogError

if TYPE_CHECKING:
    from engine.catalog import Catalog
    from ingest.log import EventLog

SHARED_DIRS = r"(\.coral/public|\.opencode|\.claude|\.codex|shared)"
# Weights and score levels are bounded so that no score can overflow to infinity
# (a weight of 1e308 made PathScore inf: every path tied, recorded for good).
MAX_WEIGHT = 1e6
KNOWLEDGE_KINDS = r"(notes|skills|attempts|roles|logs)"
# A slot is a thread of the exploring process (and on the Ray executor an actor):
# --parallel 100000 ran for ~34 s and then failed with "can't start new thread".
# The cap is this, or half of the user's limit of processes and threads
# (RLIMIT_NPROC, ``ulimit -u``: the slots share it with everything else the user
# runs), whichever is lower. It is checked where a run starts or resumes, not in
# RunConfig: a run recorded with more slots stays readable, and resumes with fewer.
MAX_PARALLEL = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _fits_a_bigint(cls, value: Any) -> Any:
        """Integers must fit the views' BIGINT (finite floats already fit a DOUBLE)."""
        if type(value) is int and not fits_int64(value):
            raise ValueError("must fit a 64-bit integer")
        return value


class SelectionConfig(_Strict):
    """Snapshot selection (ALGORITHM §1)."""

    num_roots: int = Field(30, ge=1)


class TreeConfig(_Strict):
    """Tree shape and stop limits (ALGORITHM §2)."""

    # Every unstarted root direction is a row of the next-work view at each point,
    # so a typo like 10**6 would stall the run (1,000 takes ~1 min on the bundled run).
    root_children: int = Field(3, ge=1, le=1000)
    max_children: int = Field(2, ge=1)
    max_depth: int = Field(4, ge=1)
    hard_token_limit: int = Field(100_000, ge=1)
    target_good_leaves: int = Field(12, ge=1)
    max_valid_edges: int = Field(40, ge=1)
    max_failed_expansions: int = Field(2, ge=1)
    tool_error_prune: float = Field(0.30, gt=0, le=1)
    alpha: float = Field(0.50, ge=0, le=MAX_WEIGHT)


class _Weights(_Strict):
    """Weights and levels: finite, and at most MAX_WEIGHT in magnitude (negative ones allowed)."""

    @field_validator("*")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if type(value) is float and abs(value) > MAX_WEIGHT:
            raise ValueError(
                f"must be between -{MAX_WEIGHT:g} and {MAX_WEIGHT:g} (larger weights can "
                "make scores overflow to infinity)"
            )
        return value


class SoftWeights(_Weights):
    """The soft verifier (ALGORITHM §2)."""

    outcome: float = 0.30
    cleanliness: float = 0.20
    knowledge: float = 0.20
    regression: float = 0.30
    outcome_improved: float = 1.0
    outcome_not_improved: float = 0.7
    cleanliness_clean: float = 1.0
    cleanliness_start: float = 0.8
    cleanliness_slope: float = 0.5
    cleanliness_floor: float = 0.3
    knowledge_improved_with: float = 1.0
    knowledge_improved_without: float = 0.8
    knowledge_not_improved_with: float = 0.6
    knowledge_not_improved_without: float = 0.4


class QWeights(_Weights):
    """Node quality Q (ALGORITHM §2)."""

    score_rank: float = 0.40
    best_rank: float = 0.30
    process: float = 0.30


class PathWeights(_Weights):
    """PathScore weights (ALGORITHM §3); ``top_k`` paths are selected per root."""

    max: float = 0.35
    avg: float = 0.25
    clean: float = 0.20
    know: float = 0.20
    top_k: int = Field(6, ge=1)

    @model_validator(mode="after")
    def _not_all_zero(self) -> PathWeights:
        if self.max == self.avg == self.clean == self.know == 0:
            raise ValueError("max, avg, clean and know are all 0: every path would score 0")
        return self


SUPERVISION_RULES = ("soft", "improved")


class SupervisionConfig(_Strict):
    """Preference pairs, unpaired labels and step labels (ALGORITHM §3, ``views/int_attempts__valued.sql``).

    ``rule`` values each finished edge attempt: ``soft``, its soft verifier (0 without a
    score); ``improved``, 1 when it improved on its parent, else 0. Two attempts from one
    node pair when their values differ by at least ``min_margin``; an attempt (and a path's
    edge) is labelled good when its value is at least ``threshold``. ``against_verdict``: a pair
    whose chosen attempt failed the tree's prune test (verdict pruned, retry or kept_exempt)
    while the rejected one passed it (kept) is dropped (``drop``) or made (``keep``).
    """

    rule: Literal["soft", "improved"] = "soft"
    min_margin: float = Field(0.1, gt=0, le=1)
    threshold: float = Field(0.7, gt=0, le=1)
    against_verdict: Literal["keep", "drop"] = "drop"


class KnowledgeConfig(_Strict):
    """Which tool calls are knowledge actions (ALGORITHM §4); regexes over the call's target."""

    file_tools: list[str] = [
        "read",
        "write",
        "edit",
        "multiedit",
        "patch",
        "list",
        "ls",
        "glob",
        "grep",
        "view",
    ]
    shell_tools: list[str] = ["bash", "shell"]
    knowledge_tools: list[str] = ["skill"]  # always a knowledge action (loads a shared skill)
    path_regex: str = rf"(^|[/\s\"'=]){SHARED_DIRS}/{KNOWLEDGE_KINDS}(/|$|[\s\"'])"
    command_regex: str = r"(^|[;&|(\s])coral\s+(notes|skills|log|show|kb)\b"

    @field_validator("path_regex", "command_regex")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        problem = regex_problem(pattern)
        if problem:
            raise ValueError(problem)
        return pattern


_RE2: list[duckdb.DuckDBPyConnection] = []  # one connection to check patterns with (~30 ms to open)


def regex_problem(pattern: str) -> str | None:
    """Why the views cannot match with ``pattern`` (they use DuckDB's RE2), or None."""
    if not _RE2:
        _RE2.append(duckdb.connect())
    try:
        _RE2[0].cursor().execute("select regexp_matches('', ?)", [pattern])
    except duckdb.Error as err:
        return f"not a regular expression DuckDB (RE2) accepts: {err}"
    return None


class GrantsConfig(_Strict):
    """A run of a campaign's ``coverage`` policy: its trees grow only as far as the campaign grants
    (``BlockGranted``), and ``views/campaign_gains.sql`` values its trees' next blocks with these."""

    campaign: str  # the campaign's name (campaign --resume continues the run)
    block_edges: int = Field(4, ge=1, le=10_000)  # valid edges in a block of budget
    flagged_weight: float = Field(0.25, ge=0, le=1)  # a root outside the learnability band weighs this


class RunConfig(_Strict):
    """Everything a run is configured with; recorded in its first event."""

    task: str | None = None
    direction: Literal["maximize", "minimize"] | None = None  # None: the snapshots' CORAL config
    seed: int = 0
    backend: str = "sim"
    # rounds for the sim (a run is a function of its seed), async for real Teachers
    # (a slot never waits for the slowest turn of a batch); replay audits either.
    schedule: Literal["rounds", "async"] = "rounds"
    parallel: int = Field(4, ge=1)
    # async: edges started beyond the free slots, their turn 1s queued, so that a slot
    # freed while the engine decides takes a turn at once; "auto": as many as the slots
    # finish in two of the engine's passes, measured as it runs (rounds: none).
    lookahead: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    # Turns in a row that end with a backend error before the run stops (resumable).
    backend_error_limit: int = Field(3, ge=1)
    # A turn that ended with a backend error is no rollout result: "ignored", its evals do not
    # score its edge (views/int_edges__judged.sql); "counted", they do, as in runs recorded
    # before this key (which are read so).
    backend_error_scores: Literal["ignored", "counted"] = "ignored"
    # Edges in a row whose every eval failed (crashed or timed out) with the same error
    # before the run stops (views/int_edges__eval_errors.sql): a grader that cannot grade.
    eval_error_limit: int = Field(3, ge=1)
    selection: SelectionConfig = SelectionConfig()
    tree: TreeConfig = TreeConfig()
    soft: SoftWeights = SoftWeights()
    q: QWeights = QWeights()
    paths: PathWeights = PathWeights()
    supervision: SupervisionConfig = SupervisionConfig()
    knowledge: KnowledgeConfig = KnowledgeConfig()
    backend_options: dict[str, Any] = Field(default_factory=dict)
    # None: every tree grows by the tree rules alone (explore; a campaign's fixed policy).
    grants: GrantsConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _schedule_for_the_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schedule") is None:
            data = dict(data, schedule="rounds" if data.get("backend", "sim") == "sim" else "async")
        return data


def parallel_cap() -> tuple[int, str]:
    """The most slots a run may have on this machine, and why."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or soft // 2 >= MAX_PARALLEL:
        return MAX_PARALLEL, f"each slot is a thread of the exploring process, and {MAX_PARALLEL} is the most a run has"
    cap = max(1, soft // 2)
    return cap, (
        f"each slot is a thread of the exploring process, and this user may run {soft} processes "
        "and threads in all (ulimit -u), of which a run takes at most half"
    )


def parallel_problem(parallel: int) -> str | None:
    """Why a run cannot have ``parallel`` slots on this machine, or None."""
    cap, why = parallel_cap()
    return None if parallel <= cap else f"{parallel} is above the cap of {cap}: {why}"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: Path | None, overrides: dict[str, Any]) -> RunConfig:
    """The run config from an optional TOML file plus command-line overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
        except OSError as err:
            raise InputError(f"{path}: cannot read the config file ({err.strerror})") from err
        except UnicodeDecodeError as err:  # TOML is UTF-8 (a file saved as UTF-16 starts with a BOM)
            raise InputError(
                f"{path}: not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x}); TOML files are UTF-8"
            ) from err
        except tomllib.TOMLDecodeError as err:
            raise InputError(f"{path}: invalid TOML ({err})") from err
    data = _merge(data, {k: v for k, v in overrides.items() if v is not None})
    where = f"{path}: " if path else ""
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        raise InputError(f"{where}invalid configuration ({problems(err)})") from err
    problem = parallel_problem(config.parallel)
    if problem:  # (a --parallel above the cap is refused as a usage error before this)
        raise InputError(f"{where}invalid configuration (parallel: {problem})")
    return config


def problems(err: ValidationError) -> str:
    """A validation error's problems on one line: ``field.path: message; ...``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in err.errors())


def defaults_agree(catalog: Catalog) -> bool:
    """Whether the runs a catalog holds give each view variable the same default (their configs): one value
    serves a catalog, so runs that disagree are read in catalogs of their own."""
    for view in catalog.views.values():
        for column in view.defaults.values():
            if catalog.query(f"select count(distinct {column}) as n from {view.name}")[0]["n"] > 1:
                return False
    return True


def recorded_config(catalog: Catalog, log: EventLog) -> RunConfig:
    """The configuration the run's first event records, validated."""
    rows = catalog.query("select config_json from run_config where run_id = ?", [log.run_id])
    if not rows:
        raise LogError(f"{log.dir}: the log has no RunStarted event - not a run of this tool")
    recorded = {k: v for k, v in json.loads(rows[0]["config_json"]).items() if k != "source"}
    try:
        return RunConfig.model_validate(recorded)
    except ValidationError as err:
        raise LogError(f"{log.dir}: the recorded run config is not valid ({problems(err)})") from err
