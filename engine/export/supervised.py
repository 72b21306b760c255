"""Preference pairs, unpaired labels and step labels as training samples (``export --format dpo|kto|steps``).

A recorded supervision selection (``SupervisionSelected``; :mod:`engine.supervision`)
names which attempts pair, how each is labelled and each path's step labels; this
module renders them from the turns' recorded conversations, as the SFT export
renders a path (:func:`~engine.export.conversations.join_turns`):

- the **prompt** of an attempt is everything its model received before its first
  answer: the system prompt, every message of the turns root to the node, then the
  attempt's own turn prompt (its messages before its first assistant message);
- its **continuation** is the rest of its own messages, from the model's first answer:
  both turns (the answers, the tool results, the eval it ran as the model saw it,
  turn 2's prompt...).

Attempts from one node receive the same turn prompt (the prompts name no attempt), so
a pair's two sides share their prompt up to the model's first answer. A log recorded
when turn prompts named their edge (``[edge <id> turn <n>]``) gives siblings
different turn prompts: a pair's prompt then ends before them and each side starts
with its own turn prompt, and ``metadata.shared_prompt`` is false (see
:func:`_pair` and :func:`answer_at`).

``dpo``: TRL's conversational preference format (``prompt``, ``chosen``,
``rejected``) for ``DPOTrainer``; a pair is written only when both attempts received
the same conversation before their own turn prompts (system prompt, tools and
messages), else counted. ``kto``: TRL's unpaired preference format (``prompt``,
``completion``, ``label``) for ``KTOTrainer``, one row per labelled attempt.
``steps``: TRL's stepwise supervision (``prompt``, ``completions``, ``labels``) with
each completion an edge's continuation (a list of messages), root to leaf. Each row
carries ``tools`` (JSON text, as the SFT samples) and ``metadata``. An attempt whose
model never answered (no assistant message of its own) has nothing of the model's to
train on: it is left out and counted (``no_answer``).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from engine.catalog import Catalog
from engine.export.conversations import (
    Contents,
    PathConversation,
    TurnConversations,
    TurnKey,
    invalid_calls,
    join_turns,
    read_conversations,
)
from engine.export_formats import BY_NAME
from engine.supervision import recorded_supervision, supervision_counts
from ingest.log import EventLog

ATTEMPT_FIELDS = (
    "verdict",
    "eval_ok",
    "edge_score",
    "improved",
    "soft",
    "outcome",
    "cleanliness",
    "knowledge",
    "regression_stability",
    "tool_calls",
    "tool_errors",
    "tool_error_rate",
    "tok",
)


def turn_keys(
    creators: dict[tuple[str, str], str],
    turns: dict[tuple[str, str], list[int]],
    tree_id: str,
    node_id: str,
    edge_id: str,
) -> tuple[list[TurnKey], list[TurnKey]]:
    """The turns of ``node_id``'s path, root to node (the edges that created it and its ancestors; a node's
    id extends its parent's), and the turns of the attempt ``edge_id`` from it."""
    parts = node_id.split(".")
    path = [creators[(tree_id, ".".join(parts[:depth]))] for depth in range(2, len(parts) + 1)]
    keys = [(edge, t) for edge in path for t in turns.get((tree_id, edge), [])]
    return keys, [(edge_id, t) for t in turns.get((tree_id, edge_id), [])]


def _sides(fmt: str, row: dict[str, Any]) -> tuple[str, list[str]]:
    """The node a recorded row's attempts start from, and those attempts (a step path: its last edge)."""
    if fmt == "dpo":
        return row["node_id"], [row["chosen_id"], row["rejected_id"]]
    if fmt == "kto":
        return row["node_id"], [row["edge_id"]]
    return row["leaf_id"].rsplit(".", 1)[0], [row["edge_ids"][-1]]


@dataclass
class SupervisedRun:
    """What one run's supervised samples are made of, read from its catalog and log."""

    run_id: str
    chosen: dict[str, Any]
    tail: int
    rows: list[dict[str, Any]]  # the recorded pairs, labels or step paths, in their recorded order
    attempts: dict[tuple[str, str], dict[str, Any]]  # (tree, edge) -> the edge's fields and its value
    creators: dict[tuple[str, str], str]  # (tree, node) -> the edge that created it
    turns: dict[tuple[str, str], list[int]]  # (tree, edge) -> its finished turns
    conversations: TurnConversations
    contents: Contents
    counts: list[dict[str, Any]]
    provenance: dict[str, Any] = field(default_factory=dict)  # the run's row of run_provenance (the card's)

    def attempt(self, tree_id: str, node_id: str, edge_id: str) -> tuple[PathConversation, int] | None:
        """The conversation of ``node_id``'s path then the attempt ``edge_id``, and where the attempt's
        own messages start; None when a turn of either recorded no conversation."""
        keys, own = turn_keys(self.creators, self.turns, tree_id, node_id, edge_id)
        if not own or any(k not in self.conversations for k in keys + own):
            return None
        conv = join_turns([self.conversations.parsed(tree_id, k) for k in keys + own], self.contents)
        start = next((i for i, owner in enumerate(conv.owners) if owner in own), None)
        return None if start is None else (conv, start)  # None: the attempt recorded no message of its own

    def fields(self, tree_id: str, edge_id: str) -> dict[str, Any]:
        return {"edge_id": edge_id, **self.attempts[(tree_id, edge_id)]}

    def turn_prompt(self, tree_id: str, edge_id: str) -> list[dict[str, Any]] | None:
        """What the attempt's first turn recorded before its model's first answer (its turn prompt); None
        when the turn recorded no conversation."""
        first = self.turns.get((tree_id, edge_id))
        if not first or (edge_id, first[0]) not in self.conversations:
            return None
        turn = self.conversations.parsed(tree_id, (edge_id, first[0]))
        own = turn.messages[max(0, turn.turn_start - turn.base) :]
        return list(itertools.takewhile(lambda m: m.get("role") != "assistant", own))


def prepare_supervised(
    log: EventLog,
    catalog: Catalog,
    selection: str | None,
    fmt: str,
    *,
    task: str | None,
    stage: str | None,
    workspace: str,
) -> SupervisedRun:
    """Read what one run's ``fmt`` samples are made of (``catalog``: its state, from :mod:`engine.derived`)."""
    run_id = log.run_id
    chosen = recorded_supervision(catalog, log, selection)
    sid, tail = chosen["selection_id"], catalog.tail_seq()
    filters = "selection_id = ? and (? is null or task = ?) and (? is null or stage = ?)"
    args = [sid, task, task, stage, stage]
    view, order = BY_NAME[fmt].view, BY_NAME[fmt].order
    rows = catalog.query(f"select * from {view} where {filters} order by {order}", args)
    values = {
        (r["tree_id"], r["edge_id"]): {"value": r["value"], "label": r["label"]}
        for r in catalog.query(
            "select tree_id, edge_id, value, label from int_labels__recorded where selection_id = ?", [sid]
        )
    }
    attempts = {
        (r["tree_id"], r["edge_id"]): {k: r[k] for k in ATTEMPT_FIELDS} | values.get((r["tree_id"], r["edge_id"]), {})
        for r in catalog.query(
            f"select tree_id, edge_id, {', '.join(ATTEMPT_FIELDS)} from edges where verdict is not null"
        )
    }
    creators, turns = shapes(catalog)
    needed: set[TurnKey] = set()  # only the turns the rows render
    for row in rows:
        node, edges = _sides(fmt, row)
        for edge in edges:
            path, own = turn_keys(creators, turns, row["tree_id"], node, edge)
            needed.update(path, own)
    conversations, contents = read_conversations(log, catalog, tail, needed, workspace)
    counts = [
        c
        for c in supervision_counts(catalog, sid)
        if (task is None or c["task"] == task) and (stage is None or c["stage"] == stage)
    ]
    return SupervisedRun(run_id, chosen, tail, rows, attempts, creators, turns, conversations, contents, counts)


def shapes(catalog: Catalog, tree_id: str | None = None):
    """The edge that created each node, and each edge's finished turns (one tree's, or every tree's)."""
    where, args = ("where tree_id = ?", [tree_id]) if tree_id is not None else ("", [])
    creators = {
        (r["tree_id"], r["node_id"]): r["edge_id"]
        for r in catalog.query(
            f"select tree_id, node_id, edge_id from int_nodes__created {where} {'and' if where else 'where'} "
            "edge_id is not null",
            args,
        )
    }
    turns: dict[tuple[str, str], list[int]] = {}
    for r in catalog.query(f"select tree_id, edge_id, turn from int_turns {where} order by edge_id, turn", args):
        turns.setdefault((r["tree_id"], r["edge_id"]), []).append(r["turn"])
    return creators, turns


@dataclass
class Written:
    """What one run's file holds and what was left out (and why)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    unrecorded: int = 0  # a turn of an attempt recorded no conversation
    differing_prompts: int = 0  # dpo: the two attempts received different conversations before their turn prompts
    no_answer: int = 0  # the model never answered in an attempt (nothing of its own to train on)
    against_verdict: int = 0  # dpo: pairs whose chosen attempt failed the tree's prune test and rejected passed
    invalid: int = 0  # a call of a tool the model was not offered
    dropped_invalid: int = 0


def supervised_samples(
    run: SupervisedRun, fmt: str, workspace: str, reasoning: bool, drop_invalid: bool, written: Written
) -> Iterator[dict[str, Any]]:
    """Yield each sample of ``run`` in the recorded order, tallying in ``written`` what is written and left out."""
    base = {"run_id": run.run_id, "selection_id": run.chosen["selection_id"], "rule": run.chosen["rule"]}
    for _tree, rows in itertools.groupby(run.rows, key=itemgetter("tree_id")):  # a tree at a time (kto's flag)
        for row, sample in _tree_samples(run, fmt, list(rows), base, workspace, reasoning, written):
            if sample is None:
                continue
            if sample["metadata"]["invalid_calls"]:
                written.invalid += 1
                if drop_invalid:
                    written.dropped_invalid += 1
                    continue
            if sample["metadata"].get("against_verdict"):
                written.against_verdict += 1
            written.counts[(row["task"] or "", row["stage"] or "")] += 1
            yield sample


def _tree_samples(run, fmt, rows, base, workspace, reasoning, written):
    """Each row of one tree with its sample (None: left out, counted in ``written``)."""
    if fmt == "dpo":
        for row in rows:
            yield row, _pair(run, row, base | _where(row, workspace), reasoning, written)
    elif fmt == "kto":
        prompts: dict[str, list[list[dict[str, Any]]]] = {}  # node -> the turn prompts its attempts read
        for row in rows:
            if (prompt := run.turn_prompt(row["tree_id"], row["edge_id"])) is not None:
                prompts.setdefault(row["node_id"], []).append(prompt)
        for row in rows:
            read = prompts.get(row["node_id"], [])
            shared = all(p == read[0] for p in read)
            attempt = run.attempt(row["tree_id"], row["node_id"], row["edge_id"])
            yield row, _label(run, row, attempt, shared, base | _where(row, workspace), reasoning, written)
    else:
        for row in rows:
            yield row, _steps(run, row, base | _where(row, workspace), reasoning, written)


def _where(row: dict[str, Any], workspace: str) -> dict[str, Any]:
    return {"task": row["task"], "stage": row["stage"], "tree_id": row["tree_id"], "workspace": workspace}


def answer_at(conv: PathConversation, start: int) -> int | None:
    """Where the model's first answer from ``start`` on is (None: it never answered): the attempt's
    turn prompt is ``conv.messages[start:answer]``, what the model made starts at the answer."""
    return next((i for i in range(start, len(conv.messages)) if conv.messages[i].get("role") == "assistant"), None)


def _pair(run, row, metadata, reasoning, written) -> dict[str, Any] | None:
    tree = row["tree_id"]
    chosen = run.attempt(tree, row["node_id"], row["chosen_id"])
    rejected = run.attempt(tree, row["node_id"], row["rejected_id"])
    if chosen is None or rejected is None:
        written.unrecorded += 1
        return None
    (c, cs), (r, rs) = chosen, rejected
    ca, ra = answer_at(c, cs), answer_at(r, rs)
    if ca is None or ra is None:
        written.no_answer += 1
        return None
    prompt = [*c.system, *c.messages[:cs]]
    if prompt != [*r.system, *r.messages[:rs]] or c.tools != r.tools:
        written.differing_prompts += 1
        return None
    shared = c.messages[cs:ca] == r.messages[rs:ra]
    if shared:  # the prompt runs to the model's first answer, the same for both
        prompt, cs, rs = prompt + c.messages[cs:ca], ca, ra
    chosen_fields, rejected_fields = run.fields(tree, row["chosen_id"]), run.fields(tree, row["rejected_id"])
    return {
        "prompt": _strip(prompt, reasoning),
        "chosen": _strip(c.messages[cs:], reasoning),
        "rejected": _strip(r.messages[rs:], reasoning),
        "tools": json.dumps(c.tools, ensure_ascii=False),
        "metadata": metadata
        | {
            "node_id": row["node_id"],
            "depth": row["depth"],
            "margin": row["margin"],
            "shared_prompt": shared,
            "against_verdict": bool(row["against_verdict"]),
            "chosen": chosen_fields,
            "rejected": rejected_fields,
            "interrupted_calls": _interrupted(c, cs) + _interrupted(r, rs),
            "invalid_calls": list(dict.fromkeys(invalid_calls(c) + invalid_calls(r))),
        },
    }


def _label(run, row, attempt, shared, metadata, reasoning, written) -> dict[str, Any] | None:
    """An attempt's unpaired sample; ``shared``: every attempt of its node here received its turn prompt."""
    if attempt is None:
        written.unrecorded += 1
        return None
    conv, start = attempt
    answer = answer_at(conv, start)
    if answer is None:
        written.no_answer += 1
        return None
    return {
        "prompt": _strip([*conv.system, *conv.messages[:answer]], reasoning),
        "completion": _strip(conv.messages[answer:], reasoning),
        "label": bool(row["label"]),
        "tools": json.dumps(conv.tools, ensure_ascii=False),
        "metadata": metadata
        | {
            "node_id": row["node_id"],
            "layer": row["layer"],
            "shared_prompt": shared,
            "attempt": run.fields(row["tree_id"], row["edge_id"]),
            "interrupted_calls": _interrupted(conv, answer),
            "invalid_calls": invalid_calls(conv),
        },
    }


def _steps(run, row, metadata, reasoning, written) -> dict[str, Any] | None:
    """A path's stepwise sample: the leaf's conversation cut where each edge's own messages start (the first
    edge's at the model's first answer, its turn prompt ending the prompt)."""
    tree, edges = row["tree_id"], row["edge_ids"]
    leaf = row["leaf_id"]
    node, (last,) = _sides("steps", row)
    made = run.attempt(tree, node, last)
    if made is None:
        written.unrecorded += 1
        return None
    conv, _ = made
    starts = [
        next((i for i, owner in enumerate(conv.owners) if owner is not None and owner[0] == e), None) for e in edges
    ]
    if None in starts:  # an edge of the path has no message of its own in the leaf's conversation
        written.unrecorded += 1
        return None
    first = answer_at(conv, starts[0])
    if first is None or (len(starts) > 1 and first >= starts[1]):
        written.no_answer += 1
        return None
    bounds = [first, *starts[1:], len(conv.messages)]
    completions = [_strip(conv.messages[a:b], reasoning) for a, b in zip(bounds, bounds[1:], strict=False)]
    return {
        "prompt": _strip([*conv.system, *conv.messages[:first]], reasoning),
        "completions": completions,
        "labels": [bool(x) for x in row["step_labels"]],
        "tools": json.dumps(conv.tools, ensure_ascii=False),
        "metadata": metadata
        | {
            "leaf_id": leaf,
            "edges": [run.fields(tree, e) for e in edges],
            "interrupted_calls": _interrupted(conv, 0),
            "invalid_calls": invalid_calls(conv),
        },
    }


def _interrupted(conv: PathConversation, start: int) -> list[str]:
    """The interrupted calls answered from ``start`` on (those of the sample's own part)."""
    answered = {m.get("tool_call_id") for m in conv.messages[start:] if m.get("role") == "tool"}
    return [c for c in conv.interrupted if c in answered]


def _strip(messages: list[dict[str, Any]], reasoning: bool) -> list[dict[str, Any]]:
    return messages if reasoning else [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
