"""The attempts from one node side by side: what ``serve``'s compare page shows of them.

Every attempt is rendered by the code that renders it in ``export --format kto``
(:meth:`engine.export.supervised.SupervisedRun.attempt`: its path's turns' recorded
conversations joined, :mod:`engine.export.conversations`), so what a researcher compares is
what a trainer would read; the prompt they shared ends where the export's pairs' prompts end
(:func:`engine.export.supervised.answer_at`).
"""

from __future__ import annotations

import json
from typing import Any

from engine.catalog import Catalog
from engine.export.conversations import read_conversations, same_content
from engine.export.supervised import SupervisedRun, answer_at, shapes, turn_keys
from ingest.log import EventLog

COMPARED = (
    "select e.tree_id, e.edge_id, e.parent_id as node_id, e.slot, e.attempt, e.verdict, e.child_id, e.improved, "
    "e.soft, e.s1, e.s2, e.outcome, e.cleanliness, e.knowledge, e.regression_stability, e.tool_calls, "
    "e.tool_errors, e.tok, l.rule, l.value, l.label "
    "from edges as e left join labels as l using (tree_id, edge_id) where e.tree_id = ? and e.parent_id = ? "
    "and exists (select 1 from int_turns as t where t.tree_id = e.tree_id and t.edge_id = e.edge_id) "
    "order by e.slot, e.attempt"
)


def node_attempts(catalog: Catalog, log: EventLog, tree_id: str, node_id: str, workspace: str) -> dict[str, Any]:
    """The attempts from one node that finished a turn, side by side (``serve``'s compare page).

    ``prompt``: what they received before they parted, as the first attempt's model
    received it: the conversation they were forked from, and the turn prompt when every
    attempt read the same one and answered it (``same_prompt``: every attempt received that
    one); ``attempts``: each attempt's edge with its scores and, once it finished, its
    value and label under the current rule (``labels``), and its messages from there on,
    each with the turn it belongs to and its index in the conversation (``messages`` None:
    a turn of it recorded no conversation). Rendered as ``export --format kto`` renders the
    attempt.
    """
    rows = catalog.query(COMPARED, [tree_id, node_id])
    creators, turns = shapes(catalog, tree_id)
    needed = {k for r in rows for keys in turn_keys(creators, turns, tree_id, node_id, r["edge_id"]) for k in keys}
    conversations, contents = read_conversations(log, catalog, catalog.tail_seq(), needed, workspace)
    run = SupervisedRun(log.run_id, {}, catalog.tail_seq(), [], {}, creators, turns, conversations, contents, [])
    made = [run.attempt(tree_id, node_id, row["edge_id"]) for row in rows]
    answers = [None if m is None else answer_at(*m) for m in made]
    leads = {
        json.dumps(m[0].messages[m[1] : a], sort_keys=True) for m, a in zip(made, answers, strict=True) if m is not None
    }
    shared_lead = len(leads) == 1 and all(a is not None for m, a in zip(made, answers, strict=True) if m is not None)
    prompts, attempts = [], []
    for row, attempt, answer in zip(rows, made, answers, strict=True):
        if attempt is None:
            attempts.append(row | {"messages": None})
            continue
        conv, start = attempt
        start = answer if shared_lead else start  # (the turn prompt they all read is the prompt's end)
        prompts.append(([*conv.system, *conv.messages[:start]], conv.tools))
        own = list(zip(conv.messages[start:], conv.owners[start:], strict=True))
        attempts.append(
            row | {"messages": [{"message": m, "owner": o, "idx": start + i} for i, (m, o) in enumerate(own)]}
        )
    prompt, tools = prompts[0] if prompts else ([], [])
    return {
        "prompt": prompt,
        "tools": tools,
        "same_prompt": all(p == prompts[0] for p in prompts),
        "attempts": attempts,
        "diverge": _diverge([[m["message"] for m in a["messages"]] for a in attempts if a["messages"] is not None]),
    }


def _diverge(own: list[list[dict[str, Any]]]) -> int | None:
    """Where the attempts' own messages first differ in content (an offset into each; None: fewer than two
    attempts)."""
    return same_content(own) if len(own) >= 2 else None
