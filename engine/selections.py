"""Top-k root-to-leaf path selections (ALGORITHM §3): the default one and reselections.

PathScore, the ranks and the Top-k are defined by the views (``int_paths__scored``,
``paths``, ``top_paths``); a selection under other weights sets the ``path_*``
variables they read. A selection is recorded as a ``PathsSelected`` decision whose
id follows from its parameters, so the same parameters never add a second one.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from engine.catalog import DECISION_THREADS, Catalog
from engine.config import MAX_WEIGHT, PathWeights, problems, recorded_config
from engine.runset import Reader
from ingest.errors import InputError, LogError, OptionError
from ingest.events import PathsSelected
from ingest.log import EventLog, LogWriter
from ingest.schema import fits_int64

WEIGHT_KEYS = ("max", "avg", "clean", "know")
PATH_FIELDS = (
    "tree_id",
    "leaf_id",
    "node_ids",
    "rank",
    "path_score",
    "avg_cleanliness",
    "avg_knowledge",
    "avg_score",
    "avg_score_rank",
    "max_score",
    "max_score_rank",
    "task",
    "stage",
    "snapshot",
)


@dataclass(frozen=True)
class Params:
    """What a selection is made with: PathScore weights, k, and an optional diversity lambda."""

    weights: dict[str, float]
    top_k: int
    diversity: float | None = None

    def recorded_weights(self) -> dict[str, float]:
        """The weights as a PathsSelected decision records them (diversity among them when set)."""
        out = {k: float(self.weights[k]) for k in WEIGHT_KEYS}
        return out if self.diversity is None else out | {"diversity": float(self.diversity)}

    def variables(self) -> dict[str, Any]:
        """The catalog variables that make the path views select with these parameters."""
        return {f"path_w_{k}": float(self.weights[k]) for k in WEIGHT_KEYS} | {
            "path_top_k": int(self.top_k),
            "path_diversity": self.diversity,
        }

    @classmethod
    def of(cls, selection: dict[str, Any]) -> Params:
        """The parameters a recorded selection was made with (its weights hold the diversity when set)."""
        weights = selection["weights"]
        return cls({k: float(weights[k]) for k in WEIGHT_KEYS}, int(selection["top_k"]), weights.get("diversity"))

    @property
    def selection_id(self) -> str:
        """A digest of the parameters (diversity only when set, so plain ids stay as they were)."""
        canon: dict[str, Any] = {"weights": {k: float(self.weights[k]) for k in WEIGHT_KEYS}, "top_k": self.top_k}
        if self.diversity is not None:
            canon["diversity"] = float(self.diversity)
        return "paths-" + hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()[:12]


def selection_id(weights: dict[str, float], top_k: int) -> str:
    """The id of a plain Top-k selection: a digest of its weights and k."""
    return Params(weights, top_k).selection_id


def parse_weights(text: str | None, defaults: dict[str, float]) -> dict[str, float]:
    """``max=0.35,avg=0.25,...`` over the defaults.

    Unknown or repeated keys, values that are not finite numbers and weights the run
    config would refuse (beyond +-1e6, or all 0) are errors: a selection is recorded
    for good, and NaN or infinite scores would tie every path.
    """
    weights = dict(defaults)
    if not text:
        return weights
    given: set[str] = set()
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in WEIGHT_KEYS:
            raise OptionError("--weights", f"expected key=value with keys {', '.join(WEIGHT_KEYS)}, got {item!r}")
        if key in given:
            raise OptionError("--weights", f"{key} is given twice")
        given.add(key)
        try:
            weights[key] = float(value)
        except ValueError as err:
            raise OptionError("--weights", f"{key} must be a number, got {value!r}") from err
        if not math.isfinite(weights[key]):
            raise OptionError("--weights", f"{key} must be a finite number, got {value!r}")
    try:
        PathWeights.model_validate(weights)
    except ValidationError as err:
        raise OptionError("--weights", problems(err)) from err
    return weights


def default_params(catalog: Catalog) -> Params:
    """The run config's selection parameters."""
    return Params(*default_parameters(catalog))


def default_parameters(catalog: Catalog) -> tuple[dict[str, float], int]:
    """The path weights and k recorded in the run config."""
    row = catalog.query("select w_path_max, w_path_avg, w_path_clean, w_path_know, top_k from run_config")[0]
    return {
        "max": row["w_path_max"],
        "avg": row["w_path_avg"],
        "clean": row["w_path_clean"],
        "know": row["w_path_know"],
    }, row["top_k"]


def path_variables(weights: dict[str, float], top_k: int) -> dict[str, Any]:
    """The catalog variables that make the path views use these weights and k."""
    return Params(weights, top_k).variables()


def top_paths(catalog: Catalog, weights: dict[str, float] | Params, top_k: int | None = None) -> list[dict[str, Any]]:
    """The selected paths per root under these parameters, in (tree, rank) order."""
    params = weights if isinstance(weights, Params) else Params(weights, top_k)  # type: ignore[arg-type]
    with catalog.variables.using(**params.variables()):
        rows = catalog.query("select * from top_paths order by tree_id, rank")
    return [{k: row[k] for k in PATH_FIELDS} for row in rows]


def selection_decision(
    catalog: Catalog, watermark: int, weights: dict[str, float] | Params, top_k: int | None = None
) -> PathsSelected:
    """The PathsSelected decision for these parameters at the catalog's state."""
    params = weights if isinstance(weights, Params) else Params(weights, top_k)  # type: ignore[arg-type]
    return PathsSelected(
        watermark=watermark,
        selection_id=params.selection_id,
        weights=params.recorded_weights(),
        top_k=params.top_k,
        paths=top_paths(catalog, params),
    )


def recorded_selections(catalog: Catalog) -> list[dict[str, Any]]:
    """Every PathsSelected decision of the run, oldest first, with parsed fields."""
    rows = catalog.query("select * from stg_paths_selected order by seq")
    for row in rows:
        row["weights"] = json.loads(row["weights"])
        row["paths"] = json.loads(row["paths"])
    return rows


def _has_trees(catalog: Catalog) -> bool:
    return bool(catalog.query("select count(*) as n from stg_root_added")[0]["n"])


@dataclass
class Reselection:
    """The outcome of ``reselect``; ``comparison``: per root and overall, the default's and this one's figures."""

    selection: dict[str, Any]
    appended: bool
    default_id: str | None
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    comparison: list[dict[str, Any]]


COMPARED = (
    "select stratum, stratum_key, selected_paths, n_eff, n_eff_ratio, mean_path_score from coverage "
    "where stratum in ('root', 'all') order by stratum = 'all', stratum_key"
)


def reselect(
    data, run_id: str, weights_text: str | None, top_k: int | None, diversity: float | None = None
) -> Reselection:
    """Select paths with other weights, k or a diversity lambda from the same log; record it once."""
    log = EventLog(data, run_id).require()
    with LogWriter.open(data, run_id) as writer, Catalog.for_log(log, threads=DECISION_THREADS) as catalog:
        # From the log alone, never from stored derived state: what is recorded must not rest on it.
        recorded_config(catalog, log)
        if not _has_trees(catalog):
            raise LogError(f"run {run_id!r} has no trees - nothing to select from")
        default = default_params(catalog)
        k = default.top_k if top_k is None else top_k
        if k < 1:
            raise OptionError("--top-k", "must be at least 1")
        if not fits_int64(k):
            raise OptionError("--top-k", "must fit a 64-bit integer")
        if diversity is not None and not (math.isfinite(diversity) and 0 <= diversity <= MAX_WEIGHT):
            raise OptionError("--diversity", f"must be a number from 0 to {MAX_WEIGHT:g}, got {diversity}")
        params = Params(parse_weights(weights_text, default.weights), k, diversity)
        existing = {s["selection_id"]: s for s in recorded_selections(catalog)}
        appended = params.selection_id not in existing
        if appended:
            decision = selection_decision(catalog, writer.tail, params)
            catalog.insert(writer.append([decision]))
            existing = {s["selection_id"]: s for s in recorded_selections(catalog)}
        chosen = existing[params.selection_id]
        comparison = _compare(catalog, default, params)
    base = existing.get(default.selection_id)
    added, removed = _diff(base["paths"] if base else [], chosen["paths"])
    return Reselection(chosen, appended, default.selection_id if base else None, added, removed, comparison)


def _compare(catalog: Catalog, default: Params, params: Params) -> list[dict[str, Any]]:
    """Per root and overall: N_eff/N and the mean PathScore of both selections (the coverage view)."""
    with catalog.variables.using(**default.variables()):
        before = {(r["stratum"], r["stratum_key"]): r for r in catalog.query(COMPARED)}
    with catalog.variables.using(**params.variables()):
        after = catalog.query(COMPARED)
    out = []
    for row in after:
        old = before.get((row["stratum"], row["stratum_key"]), {})
        out.append(
            {
                "tree_id": row["stratum_key"] if row["stratum"] == "root" else "all",
                "n_eff_ratio_default": old.get("n_eff_ratio"),
                "n_eff_ratio": row["n_eff_ratio"],
                "mean_path_score_default": old.get("mean_path_score"),
                "mean_path_score": row["mean_path_score"],
            }
        )
    return out


def _diff(before: list[dict], after: list[dict]) -> tuple[list[dict], list[dict]]:
    key = lambda p: (p["tree_id"], p["leaf_id"])  # noqa: E731
    old, new = {key(p): p for p in before}, {key(p): p for p in after}
    return [new[k] for k in sorted(new.keys() - old.keys())], [old[k] for k in sorted(old.keys() - new.keys())]


def recorded_selection(catalog: Catalog, run_id: str, selection: str | None) -> dict[str, Any]:
    """A recorded selection of the run: the one named, else the run config's default.

    LogError when the run has none (no trees, or still running), InputError when it
    has none of that id.
    """
    recorded = {s["selection_id"]: s for s in recorded_selections(catalog)}
    if not recorded:
        if not _has_trees(catalog):
            raise LogError(f"run {run_id!r} has no trees (not an exploration run) - no paths")
        raise LogError(f"run {run_id!r} has no path selection yet (is it still running?)")
    wanted = selection or selection_id(*default_parameters(catalog))
    if wanted not in recorded:
        known = ", ".join(sorted(recorded))
        raise InputError(f"run {run_id!r} has no selection {wanted!r} (recorded: {known})")
    return recorded[wanted]


def selected_paths(
    reader: Reader, run_id: str, selection: str | None, tree_id: str | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recorded selection (default: the run config's) and its paths, maybe one tree's, read through ``reader``."""
    with reader.open(run_id) as catalog:
        chosen = recorded_selection(catalog, run_id, selection)
    wanted = chosen["selection_id"]
    rows = [p for p in chosen["paths"] if tree_id is None or p["tree_id"] == tree_id]
    if tree_id is not None and not rows:
        raise InputError(f"selection {wanted!r} has no path of tree {tree_id!r}")
    return chosen, rows
