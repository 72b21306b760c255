"""Preference pairs, unpaired labels and step labels (ALGORITHM §3): the default selection and reselections.

Each finished edge attempt's value and label, the pairs and the step paths are
defined by the views (``int_attempts__valued``, ``int_pairs``, ``int_step_paths``;
public ``labels``, ``pairs``, ``steps``); a selection under another rule sets the
``supervision_*`` variables they read. A selection is recorded as a
``SupervisionSelected`` decision whose id follows from its rule, so the same rule
never adds a second one; ``export --format dpo|kto|steps`` writes a recorded one.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from engine.catalog import DECISION_THREADS, Catalog
from engine.config import SUPERVISION_RULES, recorded_config
from ingest.errors import InputError, LogError, OptionError
from ingest.events import SupervisionSelected
from ingest.log import EventLog, LogWriter
from ingest.paths import command_line

PAIR_FIELDS = ("tree_id", "node_id", "depth", "chosen_id", "rejected_id", "margin", "task", "stage")
LABEL_FIELDS = ("tree_id", "edge_id", "node_id", "layer", "value", "label", "task", "stage")
STEP_FIELDS = ("tree_id", "leaf_id", "edge_ids", "step_values", "step_labels", "task", "stage")
AGAINST_VERDICT = ("drop", "keep")
COUNTED = (
    "pairs",
    "against_verdict",
    "fork_points",
    "pair_n_eff",
    "pair_n_eff_ratio",
    "labelled",
    "good",
    "bad",
    "step_paths",
    "steps",
)


@dataclass(frozen=True)
class Rule:
    """How attempts are valued (``soft`` or ``improved``), the least margin of a pair, a good label's
    threshold, and whether a pair may go against the tree's verdicts (``against_verdict``: ``drop``
    or ``keep``; see ``views/int_pairs.sql``)."""

    rule: str
    min_margin: float
    threshold: float
    against_verdict: str = "keep"

    def variables(self) -> dict[str, Any]:
        """The catalog variables that make the views value, pair and label by this rule."""
        return {
            "supervision_rule": self.rule,
            "supervision_min_margin": float(self.min_margin),
            "supervision_threshold": float(self.threshold),
            "supervision_against_verdict": self.against_verdict,
        }

    @property
    def selection_id(self) -> str:
        """A digest of the rule and its numbers (``against_verdict`` only when ``drop``: a selection
        recorded before the rule had it kept such pairs, and keeps its id)."""
        canon: dict[str, Any] = {
            "rule": self.rule,
            "min_margin": float(self.min_margin),
            "threshold": float(self.threshold),
        }
        if self.against_verdict != "keep":
            canon["against_verdict"] = self.against_verdict
        return "supervision-" + hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()[:12]


def default_rule(catalog: Catalog) -> Rule:
    """The run config's ``[supervision]`` rule (the defaults in runs recorded before it)."""
    row = catalog.query(
        "select supervision_rule, supervision_min_margin, supervision_threshold, supervision_against_verdict "
        "from run_config"
    )[0]
    return Rule(
        row["supervision_rule"],
        row["supervision_min_margin"],
        row["supervision_threshold"],
        row["supervision_against_verdict"],
    )


def checked_rule(
    default: Rule,
    rule: str | None,
    min_margin: float | None,
    threshold: float | None,
    against_verdict: str | None = None,
) -> Rule:
    """``default`` with what is given instead; OptionError for an unknown rule or a number out of (0, 1]."""
    if rule is not None and rule not in SUPERVISION_RULES:
        raise OptionError("--rule", f"must be one of {', '.join(SUPERVISION_RULES)}, not {rule!r}")
    if against_verdict is not None and against_verdict not in AGAINST_VERDICT:
        raise OptionError("--against-verdict", f"must be one of {', '.join(AGAINST_VERDICT)}, not {against_verdict!r}")
    for name, value in (("--min-margin", min_margin), ("--threshold", threshold)):
        if value is not None and not (math.isfinite(value) and 0 < value <= 1):
            raise OptionError(name, f"must be a number above 0 and at most 1, got {value}")
    return Rule(
        default.rule if rule is None else rule,
        default.min_margin if min_margin is None else min_margin,
        default.threshold if threshold is None else threshold,
        default.against_verdict if against_verdict is None else against_verdict,
    )


def supervision_decision(catalog: Catalog, watermark: int, rule: Rule) -> SupervisionSelected:
    """The SupervisionSelected decision for this rule at the catalog's state (lists in a total order)."""
    with catalog.variables.using(**rule.variables()):
        pairs = catalog.query(
            f"select {', '.join(PAIR_FIELDS)} from pairs order by tree_id, node_key(node_id), chosen_id, rejected_id"
        )
        labels = catalog.query(f"select {', '.join(LABEL_FIELDS)} from labels order by tree_id, edge_id")
        steps = catalog.query(f"select {', '.join(STEP_FIELDS)} from steps order by tree_id, node_key(leaf_id)")
    return SupervisionSelected(
        watermark=watermark,
        selection_id=rule.selection_id,
        rule=rule.rule,
        min_margin=float(rule.min_margin),
        threshold=float(rule.threshold),
        against_verdict=rule.against_verdict,
        pairs=pairs,
        labels=labels,
        step_paths=steps,
    )


def recorded_supervisions(catalog: Catalog) -> list[dict[str, Any]]:
    """Every SupervisionSelected decision of the run, oldest first: its id, rule and numbers (the lists are
    read through the int_*__recorded views)."""
    return catalog.query(
        "select seq, watermark, selection_id, rule, min_margin, threshold, against_verdict "
        "from stg_supervision_selected order by seq"
    )


def recorded_supervision(catalog: Catalog, log: EventLog, selection: str | None) -> dict[str, Any]:
    """A recorded supervision selection of the run: the one named, else the run config's default.

    LogError when the run has none (no trees, still running, or recorded before
    supervision selections: ``reselect --rule``), InputError when it has none of that id.
    """
    run_id = log.run_id
    recorded = {s["selection_id"]: s for s in recorded_supervisions(catalog)}
    if not recorded:
        if not catalog.query("select count(*) as n from stg_root_added")[0]["n"]:
            raise LogError(f"run {run_id!r} has no trees (not an exploration run) - no pairs, labels or steps")
        raise LogError(
            f"run {run_id!r} has no supervision selection (still running, or recorded before them: "
            f"record one with: {command_line(log.data_dir, 'reselect', run_id, '--rule', 'soft')})"
        )
    wanted = selection or default_rule(catalog).selection_id
    if wanted not in recorded:
        known = ", ".join(sorted(recorded))
        raise InputError(f"run {run_id!r} has no supervision selection {wanted!r} (recorded: {known})")
    return recorded[wanted]


@dataclass
class Supervision:
    """The outcome of ``reselect --rule``: the selection, whether it was appended, its counts by task and stage."""

    selection: dict[str, Any]
    appended: bool
    counts: list[dict[str, Any]]


def reselect_supervision(
    data,
    run_id: str,
    rule: str | None,
    min_margin: float | None,
    threshold: float | None,
    against_verdict: str | None = None,
) -> Supervision:
    """Value, pair and label the attempts by another rule from the same log; record it once."""
    log = EventLog(data, run_id).require()
    with LogWriter.open(data, run_id) as writer, Catalog.for_log(log, threads=DECISION_THREADS) as catalog:
        # From the log alone, never from stored derived state: what is recorded must not rest on it.
        recorded_config(catalog, log)
        if not catalog.query("select count(*) as n from stg_root_added")[0]["n"]:
            raise LogError(f"run {run_id!r} has no trees - nothing to pair or label")
        chosen = checked_rule(default_rule(catalog), rule, min_margin, threshold, against_verdict)
        existing = {s["selection_id"] for s in recorded_supervisions(catalog)}
        appended = chosen.selection_id not in existing
        if appended:
            catalog.insert(writer.append([supervision_decision(catalog, writer.tail, chosen)]))
        selection = next(s for s in recorded_supervisions(catalog) if s["selection_id"] == chosen.selection_id)
        counts = supervision_counts(catalog, chosen.selection_id)
    return Supervision(selection, appended, counts)


def supervision_counts(catalog: Catalog, selection_id: str) -> list[dict[str, Any]]:
    """A recorded selection's pairs, fork points, N_eff, labels and step paths by task and stage."""
    return catalog.query(
        f"select task, stage, {', '.join(COUNTED)} from supervision_counts where selection_id = ? "
        "order by task nulls first, stage nulls first",
        [selection_id],
    )
