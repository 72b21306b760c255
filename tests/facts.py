"""Builders of hand-made fact streams for view tests."""

from __future__ import annotations

from engine.catalog import Catalog
from engine.config import RunConfig
from ingest.events import (
    EdgeStarted,
    EvalFinished,
    Event,
    RootAdded,
    StepFinished,
    ToolCalled,
    TurnFinished,
)

NOTE = ".opencode/notes/finding.md"


def root(tree_id: str = "T1", score: float = 1.0) -> RootAdded:
    return RootAdded(tree_id=tree_id, task="t", snapshot=f"snap-{tree_id}", path="/x", score=score)


def start(edge_id: str, parent: str, slot: int | None = None, attempt: int | None = None) -> EdgeStarted:
    """EdgeStarted of ``edge_id`` (<parent>/e<slot>-<attempt>; slot and attempt read from it)."""
    tree = parent.split(".")[0]
    slot_text, attempt_text = edge_id.rsplit("/e", 1)[1].split("-")
    slot = int(slot_text) if slot is None else slot
    attempt = int(attempt_text) if attempt is None else attempt
    return EdgeStarted(tree_id=tree, edge_id=edge_id, parent_id=parent, slot=slot, attempt=attempt)


def turn(
    edge_id: str,
    n: int,
    score: float | None,
    calls: int = 4,
    errors: int = 0,
    knowledge: bool = False,
    tokens: int = 10_000,
    steps: int = 2,
    outcome: str = "completed",
) -> list[Event]:
    """The facts of one finished turn: tool calls, steps, eval result, TurnFinished (ended with ``outcome``)."""
    tree = edge_id.split(".")[0].split("/")[0]
    ids = {"tree_id": tree, "edge_id": edge_id, "turn": n}
    facts: list[Event] = []
    for i in range(calls):
        target = NOTE if knowledge and i == 0 else f"src/file{i}.py"
        status = "error" if i >= calls - errors else "ok"
        facts.append(ToolCalled(**ids, step=1, call_id=f"{edge_id}-{n}-{i}", tool="read", status=status, target=target))
    for s in range(1, steps + 1):
        facts.append(StepFinished(**ids, step=s, tokens_total=tokens if s == steps else tokens // 2))
    facts.append(EvalFinished(**ids, score=score, eval_status="ok" if score is not None else "crashed"))
    error = "opencode serve lost the turn" if outcome == "error" else None
    facts.append(
        TurnFinished(**ids, context_tokens=tokens, state={"edge": edge_id, "turn": n}, outcome=outcome, error=error)
    )
    return facts


def edge(
    edge_id: str,
    parent: str,
    s1: float | None,
    s2: float | None,
    slot: int | None = None,
    attempt: int | None = None,
    skip2: bool = False,
    **kw,
) -> list[Event]:
    """EdgeStarted plus both turns (or only turn 1 when ``skip2``)."""
    events: list[Event] = [start(edge_id, parent, slot, attempt)]
    events += turn(edge_id, 1, s1, **kw)
    if not skip2:
        events += turn(edge_id, 2, s2, **kw)
    return events


def catalog(events: list[Event], config: RunConfig | dict | None = None) -> Catalog:
    from conftest import catalog_of

    return catalog_of(events, config or RunConfig(task="t"))


def fanout(tree: str = "T1", scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.1)), **kw) -> list[Event]:
    """The root's three kept directions T.1..T.3 (kept in slot order)."""
    events: list[Event] = []
    for slot, (s1, s2) in enumerate(scores, start=1):
        events += edge(f"{tree}/e{slot}-1", tree, s1, s2, slot=slot, **kw)
    return events
