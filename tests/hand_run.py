"""A small run built by hand for the export's golden files: one tree, three edges, two paths.

    T1 --T1/e1-1--> T1.1 --T1.1/e1-1--> T1.1.1   turn 1 killed in the middle of a bash call
                         --T1.1/e2-1--> T1.1.2   turn 2 killed in the middle of a bash call

T1/e1-1 turn 1 makes two parallel calls (1 of the edge's 4 fails: kept) (a note read, a read of a missing file: a
tool error), reported in the order they finished (the missing file first) and
recorded in the order the model made them; its answer has reasoning. The children's
sessions fork T1.1's, so their conversations cut the inherited one at ``base``.
Every workspace is a per-edge directory under /runs/hand/worktrees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.catalog import Catalog
from engine.config import RunConfig, TreeConfig
from engine.selections import default_parameters, selection_decision
from ingest.events import (
    ConversationRecorded,
    EdgeStarted,
    EvalFinished,
    Event,
    RootAdded,
    RunFinished,
    RunStarted,
    StepFinished,
    ToolCalled,
    TurnFinished,
    content_fact,
)
from ingest.log import EventLog, LogWriter

CONFIG = RunConfig(task="speedup", tree=TreeConfig(root_children=1, max_children=2, max_depth=2, target_good_leaves=2))
WORKTREES = "/runs/hand/worktrees/T1"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]},
        },
    }
    for name, key in (("bash", "command"), ("read", "filePath"), ("write", "filePath"))
]
INTERRUPTED = "[Tool execution was interrupted]"


def workspace(edge_id: str) -> str:
    return f"{WORKTREES}/{edge_id.replace('/', '_')}/wt"


def system(edge_id: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"You are a coding agent.\nWorking directory: {workspace(edge_id)}"}]


def call(call_id: str, tool: str, **args: str) -> dict[str, Any]:
    import json

    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}


def assistant(content: str = "", *calls: dict[str, Any], reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turn_facts(
    edge_id: str,
    n: int,
    score: float | None,
    messages: list[dict[str, Any]],
    base: int,
    turn_start: int,
    calls: list[tuple[str, str, str, str | None]],
    steps: int,
    model_calls: int,
    outcome: str = "completed",
    inherited_state: int = 0,
) -> list[Event]:
    """One turn: its tool calls (as reported: id, tool, status, error), steps, conversation, eval."""
    tree = "T1"
    ids = {"tree_id": tree, "edge_id": edge_id, "turn": n}
    facts: list[Event] = [
        ToolCalled(**ids, step=1, call_id=c, tool=t, status=s, target="x", error=e) for c, t, s, e in calls
    ]
    facts += [
        StepFinished(
            **ids,
            step=k,
            tokens_input=1000 * k,
            tokens_output=50,
            tokens_reasoning=5,
            tokens_cache_read=200,
            tokens_total=1255 * k,
            cost=0.001 * k,
        )
        for k in range(1, steps + 1)
    ]
    sys_fact, tools_fact = content_fact("system", system(edge_id)), content_fact("tools", TOOLS)
    facts += [
        sys_fact,
        tools_fact,
        ConversationRecorded(
            **ids,
            system_id=sys_fact.content_id,
            tools_id=tools_fact.content_id,
            base=base,
            turn_start=turn_start,
            model_calls=model_calls,
            workspace=workspace(edge_id),
            recorder="hand",
            messages=messages,
        ),
    ]
    facts.append(EvalFinished(**ids, score=score, eval_status="timeout" if score is None else "improved"))
    facts.append(
        TurnFinished(
            **ids, context_tokens=1255 * steps, outcome=outcome, state={"messages": inherited_state + len(messages)}
        )
    )
    return facts


def events() -> list[Event]:
    ws1, ws11, ws12 = workspace("T1/e1-1"), workspace("T1.1/e1-1"), workspace("T1.1/e2-1")
    t1 = [
        user("Improve the solution [edge T1/e1-1 turn 1]"),
        assistant(
            "",
            call("c1", "read", filePath=f"{ws1}/.opencode/notes/tiling.md"),
            call("c2", "read", filePath=f"{ws1}/missing.py"),
            reasoning="Read the note first.",
        ),
        tool("c1", "Tiles of 64 were best."),
        tool("c2", f"File not found: {ws1}/missing.py"),
        assistant("I read the note; the tile size is set.", reasoning="The note says 64."),
    ]
    t2 = [
        user("Improve it further [edge T1/e1-1 turn 2]"),
        assistant(
            "",
            call("c3", "write", filePath=f"{ws1}/solution.py", content="TILE = 64", alpha=1),
            call("c3b", "read", filePath=f"{ws1}/solution.py"),
        ),
        tool("c3", "Wrote file successfully."),
        tool("c3b", "TILE = 64"),
        assistant("Done: TILE = 64."),
    ]
    n1 = len(t1) + len(t2)
    t11a = [user("Next [edge T1.1/e1-1 turn 1]"), assistant("", call("c4", "bash", command="sleep 600"))]
    t11b = [
        tool("c4", INTERRUPTED),
        user("Again [edge T1.1/e1-1 turn 2]"),
        assistant("", call("c5", "bash", command=f"cd {ws11} && make")),
        tool("c5", "ok"),
        assistant("Built."),
    ]
    t12a = [user("Next [edge T1.1/e2-1 turn 1]"), assistant("Nothing to change.")]
    t12b = [user("Again [edge T1.1/e2-1 turn 2]"), assistant("", call("c6", "bash", command=f"ls {ws12}"))]
    root = RootAdded(
        tree_id="T1", task="speedup", snapshot="eval-000001-agent-1-abc", path="/x", score=1.0, stage="late"
    )
    out: list[Event] = [root]
    out.append(EdgeStarted(tree_id="T1", edge_id="T1/e1-1", parent_id="T1", slot=1, attempt=1))
    out += turn_facts(
        "T1/e1-1",
        1,
        1.2,
        t1,
        0,
        0,
        [("c2", "read", "error", f"File not found: {ws1}/missing.py"), ("c1", "read", "ok", None)],
        2,
        2,
    )
    out += turn_facts(
        "T1/e1-1",
        2,
        1.3,
        t2,
        len(t1),
        len(t1),
        [("c3", "write", "ok", None), ("c3b", "read", "ok", None)],
        2,
        2,
        inherited_state=len(t1),
    )
    out.append(EdgeStarted(tree_id="T1", edge_id="T1.1/e1-1", parent_id="T1.1", slot=1, attempt=1))
    out.append(EdgeStarted(tree_id="T1", edge_id="T1.1/e2-1", parent_id="T1.1", slot=2, attempt=1))
    # Killed during their calls: the endpoint's answer is the step the stream never printed.
    out += turn_facts("T1.1/e1-1", 1, None, t11a, n1, n1, [], 1, 1, "timeout", n1)
    out += turn_facts(
        "T1.1/e1-1", 2, 1.5, t11b, n1 + 2, n1 + 3, [("c5", "bash", "ok", None)], 2, 2, inherited_state=n1 + 2
    )
    out += turn_facts("T1.1/e2-1", 1, 1.4, t12a, n1, n1, [], 1, 1, inherited_state=n1)
    out += turn_facts("T1.1/e2-1", 2, None, t12b, n1 + 2, n1 + 2, [], 1, 1, "timeout", n1 + 2)
    return out


def write(data_dir: Path, run_id: str = "hand", select: bool = True, drop: set[str] | None = None) -> str:
    """The hand-built run in ``data_dir`` (with its default path selection unless ``select`` is false)."""
    started = RunStarted(command="explore", task="speedup", config=CONFIG.model_dump(mode="json"))
    facts = [started, *events()]
    if drop:  # leave out the conversation of these turns ("edge#turn")
        facts = [f for f in facts if not (isinstance(f, ConversationRecorded) and f"{f.edge_id}#{f.turn}" in drop)]
    with LogWriter.create(data_dir, run_id) as writer:
        writer.append(facts)
        if select:
            catalog = Catalog.for_log(EventLog(data_dir, run_id))
            weights, top_k = default_parameters(catalog)
            writer.append([selection_decision(catalog, writer.tail, weights, top_k), RunFinished()])
    return run_id
