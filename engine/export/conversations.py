"""The conversation of a path: its turns' recorded conversations, joined in path order.

A turn records what its model received (``ConversationRecorded``): the conversation
its session was forked from, cut at ``base``, then its own ``messages``. Walking a
path's turns root to leaf and applying that cut-and-append gives the conversation
of the path's last turn: what the model received in its last request, then its
answer. The system prompt and the tool list are those of the last turn.

The heavy columns (messages, bodies) are read from the Parquet log, only for the
turns asked for: ``TurnConversations.read`` and ``Contents.read`` scan one kind each,
a batch at a time. A turn's messages stay JSON text until a path needs them
(:meth:`TurnConversations.parsed`, a tree at a time).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.catalog import Catalog
from engine.teachers.opencode.recorder import INTERRUPTED
from ingest.log import EventLog

TurnKey = tuple[str, int]  # (edge_id, turn)
REPAIRED = "invalid"  # the tool OpenCode puts in place of a call of an unknown one (never a call the model made)


@dataclass(frozen=True)
class TurnConversation:
    """One turn's recorded conversation (the fields of ConversationRecorded export uses)."""

    edge_id: str
    turn: int
    system_id: str | None
    tools_id: str | None
    base: int
    turn_start: int
    messages: list[dict[str, Any]]


class TurnConversations(dict[TurnKey, tuple[TurnConversation, str]]):
    """The recorded conversations of some turns, by (edge id, turn): the fields, and the messages as JSON text."""

    def __init__(self, placeholder: Placeholder | None = None) -> None:
        super().__init__()
        self.placeholder = placeholder
        self._parsed: dict[TurnKey, TurnConversation] = {}
        self._tree: str | None = None

    def parsed(self, tree_id: str, key: TurnKey) -> TurnConversation:
        """A turn's conversation with its messages parsed (workspaces replaced); kept while the same tree asks.

        Each turn's messages are replaced once, not once per path through the turn.
        """
        if tree_id != self._tree:
            self._parsed, self._tree = {}, tree_id
        if key not in self._parsed:
            fields, text = self[key]
            messages = json.loads(text)
            if self.placeholder is not None:
                messages = self.placeholder.apply(messages)
            self._parsed[key] = TurnConversation(**{**fields.__dict__, "messages": messages})
        return self._parsed[key]

    @classmethod
    def read(
        cls, log: EventLog, upto: int, turns: set[TurnKey], placeholder: Placeholder | None = None
    ) -> TurnConversations:
        """The conversations of ``turns`` in the log prefix ``1..upto`` (the last one of a turn wins)."""
        found = cls(placeholder)
        columns = ["edge_id", "turn", "system_id", "tools_id", "base", "turn_start", "messages"]
        for batch in log.scan_kind("conversation_recorded", columns, upto):
            for row in batch.to_pylist():
                key = (row["edge_id"], row["turn"])
                if key in turns:
                    found[key] = (
                        TurnConversation(
                            row["edge_id"],
                            row["turn"],
                            row["system_id"],
                            row["tools_id"],
                            row["base"] or 0,
                            row["turn_start"] or 0,
                            [],
                        ),
                        row["messages"] or "[]",
                    )
        return found


def read_conversations(
    log: EventLog, catalog: Catalog, upto: int, turns: set[TurnKey], workspace: str
) -> tuple[TurnConversations, Contents]:
    """The conversations of ``turns`` and their system prompts and tool lists in the log prefix
    ``1..upto``, every workspace of the run (``catalog``: its state) replaced by ``workspace``
    (``conversations.placeholder``)."""
    recorded = catalog.query("select distinct workspace from stg_conversation_recorded")
    placeholder = Placeholder([r["workspace"] for r in recorded], workspace)
    conversations = TurnConversations.read(log, upto, turns, placeholder)
    ids = {i for c, _ in conversations.values() for i in (c.system_id, c.tools_id) if i}
    return conversations, Contents.read(log, upto, ids, placeholder)


class Contents(dict[str, Any]):
    """Recorded system prompts and tool lists, by content id (parsed JSON)."""

    @classmethod
    def read(cls, log: EventLog, upto: int, ids: set[str], placeholder: Placeholder | None = None) -> Contents:
        """The contents of ``ids`` in the log prefix ``1..upto`` (workspaces replaced by ``placeholder``)."""
        found = cls()
        for batch in log.scan_kind("content_recorded", ["content_id", "body"], upto):
            for row in batch.to_pylist():
                if row["content_id"] in ids and row["content_id"] not in found:
                    body = json.loads(row["body"])
                    found[row["content_id"]] = placeholder.apply(body) if placeholder is not None else body
        return found


@dataclass
class PathConversation:
    """A path's conversation: system messages, tools, messages, and who made each message."""

    system: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    owners: list[TurnKey | None]  # the turn each message belongs to (None: before the first)
    interrupted: list[str] = field(default_factory=list)  # call ids whose result is INTERRUPTED


def join_turns(turns: list[TurnConversation], contents: Contents) -> PathConversation:
    """Cut-and-append the turns' conversations in path order (see the module docstring).

    A message belongs to the latest turn whose own messages start at or before it.
    Tool calls no later message answers (a killed last turn recorded before the recorder
    kept the results OpenCode sends on) get INTERRUPTED results.
    """
    messages: list[dict[str, Any]] = []
    starts: list[tuple[int, TurnKey]] = []
    for turn in turns:
        messages = messages[: turn.base] + turn.messages
        starts.append((turn.turn_start, (turn.edge_id, turn.turn)))
    last = turns[-1]
    messages = _answer_dangling_calls(messages)
    interrupted = [m["tool_call_id"] for m in messages if m.get("role") == "tool" and m.get("content") == INTERRUPTED]
    owners: list[TurnKey | None] = []
    for i in range(len(messages)):
        owned = [key for start, key in starts if start <= i]
        owners.append(owned[-1] if owned else None)
    system = contents.get(last.system_id, []) if last.system_id else []
    tools = contents.get(last.tools_id, []) if last.tools_id else []
    return PathConversation(list(system), list(tools), messages, owners, interrupted)


def _answer_dangling_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for message in messages:
        if pending and message.get("role") != "tool":
            out += [{"role": "tool", "tool_call_id": c, "content": INTERRUPTED} for c in pending]
            pending = []
        out.append(message)
        if message.get("role") == "assistant":
            missing = [c["id"] for c in message.get("tool_calls") or [] if c.get("id") not in answered]
            pending += missing
    out += [{"role": "tool", "tool_call_id": c, "content": INTERRUPTED} for c in pending]
    return out


def same_content(conversations: list[list[dict[str, Any]]]) -> int:
    """How many leading messages the conversations share in content: role, text, reasoning, calls'
    names and arguments; not the ids a model server gives calls (they differ between equal answers)."""
    contents = [map(_content, messages) for messages in conversations]
    return sum(1 for _ in itertools.takewhile(lambda m: all(x == m[0] for x in m), zip(*contents, strict=False)))


def _content(message: dict[str, Any]) -> tuple:
    calls = [
        ((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
        for c in message.get("tool_calls") or []
    ]
    return message.get("role"), message.get("content"), message.get("reasoning_content"), calls


def invalid_calls(conv: PathConversation) -> list[str]:
    """The ids of the sample's tool calls of a tool the model was not offered.

    A model's call of an unknown tool reaches the model again, in later requests, as
    OpenCode rewrote it (a call of ``invalid`` with the error in its arguments): what
    the model received, but no call the model made.
    """
    offered = {(t.get("function") or {}).get("name") for t in conv.tools} - {REPAIRED}
    return [
        c.get("id")
        for m in conv.messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
        if (c.get("function") or {}).get("name") not in offered
    ]


class Placeholder:
    """Replaces every workspace directory of a run by one stable path in exported text.

    The workspaces of a run share a prefix (``<worktrees>/``): one regular expression
    finds the prefix, then the longest workspace that follows.
    """

    def __init__(self, workspaces: Iterable[str], placeholder: str) -> None:
        found = sorted({w.rstrip("/") for w in workspaces if w and w.rstrip("/")}, key=lambda w: (-len(w), w))
        self.placeholder = placeholder
        self._pattern = None
        self._prefix = ""
        if found:
            prefix = self._prefix = os.path.commonprefix(found)
            rest = "|".join(re.escape(w[len(prefix) :]) for w in found)
            # A workspace ends where a path component ends (.../wt, not .../wt2).
            self._pattern = re.compile(re.escape(prefix) + f"(?:{rest})" + r"(?![A-Za-z0-9_.\-])")

    def text(self, value: str) -> str:
        if self._pattern is None or self._prefix not in value:  # most strings name no workspace
            return value
        return self._pattern.sub(lambda _m: self.placeholder, value)

    def apply(self, value: Any) -> Any:
        """``value`` (JSON data) with every string's workspaces replaced."""
        return value if self._pattern is None else self._apply(value)

    def _apply(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return self.text(value)
        if kind is list:
            return [self._apply(v) for v in value]
        if kind is dict:
            return {k: self._apply(v) for k, v in value.items()}
        return value
