"""A campaign's choices, as pure functions: the runs' view rows in, a round's grants (or its stop) out.

The live campaign and its replay both call :func:`decide` with the rows of each run's
``campaign_gains`` and ``campaign_spend`` views read at the round's marks, so replay
re-derives every allocation from the runs' logs. The gains are defined in the view;
here they are only ranked (docs/CAMPAIGNS.md):

- round 0 (``first_pass``): every root of every task gets ``first_pass_edges`` (or, with
  ``first_pass_roots`` = k, k roots of each task spread evenly over its roots in tree
  order: the i-th of n at index i * n // k), by task and tree id, while the edge budget
  lasts; a root left unopened is a candidate of every later round like any tree;
- with a token budget and ``first_pass_probe``, round 0 gives only the first of each
  task's first-pass roots its block (what an edge costs is unknown before), and round 1
  (``first_pass``) the others, the i-th root of every task before the (i+1)-th, while
  the budget lasts (a block's expected tokens must fit the tokens left, except the
  round's first);
- later rounds (``coverage``): the eligible trees of every task ranked by gain
  (rounded to 12 digits, highest first; a tree without a gain last), ties by task and
  tree id; the first ``blocks_per_round`` of them get a block of ``block_edges`` each,
  while the budget lasts (the last block takes the edges left; a block's expected
  tokens must fit the tokens left, except the round's first);
- no block to give: the campaign stops, ``budget_spent`` or ``trees_stopped``.

A ``fixed`` campaign decides only its stop, once every run has finished (``trees_stopped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.campaign.config import CampaignConfig

Row = dict[str, Any]


@dataclass(frozen=True)
class TaskRows:
    """What one task's run shows when a round reads it: its gains rows and its spend row."""

    task: str
    run_id: str
    gains: list[Row]
    spend: Row


@dataclass(frozen=True)
class Round:
    """A round's decision: its grants (task, run, tree_id, edges, gain), or the stop reason."""

    rule: str
    grants: list[dict[str, Any]]
    stop: str | None = None


def _rank(row: Row) -> tuple:
    gain = row["gain"]
    return (gain is None, -round(gain, 12) if gain is not None else 0.0, row["task"], row["tree_id"])


def _first_pass(eligible: list[Row], roots: int | None) -> list[Row]:
    """The roots the first pass opens: every one, or ``roots`` of each task spread evenly (by task, tree id)."""
    return [row for task in _first_pass_by_task(eligible, roots) for row in task]


def _first_pass_by_task(rows: list[Row], roots: int | None) -> list[list[Row]]:
    """Each task's first-pass roots in tree order (the tasks in name order)."""
    ordered = sorted(rows, key=lambda r: (r["task"], r["tree_id"]))
    out: list[list[Row]] = []
    for task in dict.fromkeys(r["task"] for r in ordered):
        trees = [r for r in ordered if r["task"] == task]
        n = len(trees)
        out.append(trees if roots is None else [trees[i * n // roots] for i in range(min(roots, n))])
    return out


def _probed(tasks: list[TaskRows], roots: int | None, round_no: int) -> list[Row] | None:
    """The blocks of a probing first pass: round 0, the first first-pass root of each task; round 1, the
    others not opened yet, the i-th of every task before the (i+1)-th. None once the first pass is over."""
    rows = [r | {"task": t.task, "run": t.run_id} for t in tasks for r in t.gains]
    by_task = _first_pass_by_task(rows, roots)  # over every tree, so that a stopped one shifts nothing
    if round_no == 0:
        return [trees[0] for trees in by_task if trees[0]["eligible"]]
    if round_no != 1:
        return None
    later = [(i, row) for trees in by_task for i, row in enumerate(trees) if i > 0]
    return [row for _, row in sorted(later, key=lambda p: p[0]) if row["eligible"] and not row["granted_edges"]]


def spent(spends: list[Row]) -> tuple[int, int]:
    """What the campaign spent: valid edges and tokens, over its runs' ``campaign_spend`` rows."""
    return sum(int(r["kept_edges"]) for r in spends), sum(int(r["tokens"]) for r in spends)


def decide(config: CampaignConfig, round_no: int, tasks: list[TaskRows]) -> Round:
    """The grants of round ``round_no`` (or the campaign's stop) from the runs' rows."""
    budget, options = config.budget, config.coverage
    if config.policy == "fixed":
        running = any(r["eligible"] for t in tasks for r in t.gains)
        return Round("fixed", []) if running else Round("stop", [], "trees_stopped")
    edges, tokens = spent([t.spend for t in tasks])
    edges_left = None if budget.edges is None else budget.edges - edges
    tokens_left = None if budget.tokens is None else budget.tokens - tokens
    if (edges_left is not None and edges_left <= 0) or (tokens_left is not None and tokens_left <= 0):
        return Round("stop", [], "budget_spent")
    eligible = [r | {"task": t.task, "run": t.run_id} for t in tasks for r in t.gains if r["eligible"]]
    if not eligible:
        return Round("stop", [], "trees_stopped")
    probed = _probed(tasks, options.first_pass_roots, round_no) if budget.tokens and options.first_pass_probe else None
    if probed:
        rule, size, ordered, limit = "first_pass", options.first_pass_edges, probed, len(probed)
    elif round_no == 0:
        rule, size = "first_pass", options.first_pass_edges
        ordered = _first_pass(eligible, options.first_pass_roots)
        limit = len(ordered)
    else:
        rule, size, limit = "coverage", options.block_edges, options.blocks_per_round
        ordered = sorted(eligible, key=_rank)
    grants: list[dict[str, Any]] = []
    for row in ordered[:limit]:
        edges = size if edges_left is None else min(size, edges_left)
        if edges <= 0:
            break
        per_edge = None if row["expected_tokens"] is None else float(row["expected_tokens"]) / options.block_edges
        cost = None if per_edge is None else per_edge * edges
        if tokens_left is not None and grants and cost is not None and cost > tokens_left:
            break
        gain = None if rule == "first_pass" or row["gain"] is None else float(row["gain"])
        grants.append({"task": row["task"], "run": row["run"], "tree_id": row["tree_id"], "edges": edges, "gain": gain})
        if edges_left is not None:
            edges_left -= edges
        if tokens_left is not None and cost is not None:
            tokens_left -= cost
    return Round(rule, grants) if grants else Round("stop", [], "budget_spent")
