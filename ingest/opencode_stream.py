"""Parse ``opencode run --format json`` streams into turn facts.

One JSON object per line with ``type`` in step_start, step_finish, tool_use, text,
reasoning, error (OpenCode 1.18.33, as measured). ``tool_use`` comes once per
call when it finishes, with ``state.status`` completed or error. Lines that are
not JSON, have no known type, or miss required keys become ``StreamLineSkipped``
facts; nothing here raises on bad input.

``tool_use`` events of one step come in the order the calls finished; the parser
holds them until the next other event (or :meth:`StreamParser.finish`) and gives
them in the order of their part ids, which OpenCode assigns as the model emits the
calls: the order the model made them in.

A tool call counts as an error when OpenCode reports ``status: error`` or when the
model called a tool that does not exist (OpenCode's ``invalid`` tool). A shell
command that exits non-zero is not a tool error: the tool worked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ingest.events import Event, MessageWritten, StepFinished, StreamLineSkipped, ToolCalled
from ingest.schema import fits_int64

SHELL_TOOLS = ("bash", "shell")
KNOWN_TYPES = {"step_start", "step_finish", "tool_use", "text", "reasoning", "error"}
MAX_TEXT = 2000

# Where each tool keeps the file, pattern or command it acts on.
TARGET_KEYS = {
    "bash": ("command",),
    "shell": ("command",),
    "read": ("filePath", "path"),
    "write": ("filePath", "path"),
    "edit": ("filePath", "path"),
    "multiedit": ("filePath", "path"),
    "patch": ("filePath", "path"),
    "list": ("path",),
    "ls": ("path",),
    "glob": ("path", "pattern"),
    "grep": ("path", "pattern", "include"),
    "skill": ("name",),
    "task": ("description", "prompt"),
    "webfetch": ("url",),
    "invalid": ("tool",),
}


def tool_target(tool: str, inputs: Any) -> str | None:
    """The path, pattern or command a tool call acts on (joined when several apply)."""
    if not isinstance(inputs, dict):
        return None
    keys = TARGET_KEYS.get(tool, ("filePath", "path", "command", "pattern"))
    values = [str(inputs[k]) for k in keys if isinstance(inputs.get(k), str | int | float)]
    if tool in ("glob", "grep") and len(values) > 1:
        return " ".join(values)
    return values[0] if values else None


@dataclass(frozen=True)
class ShellCall:
    """A shell tool call that completed: its command, what it printed, and how long it ran (None if not said)."""

    command: str
    output: str
    seconds: float | None = None


@dataclass
class TurnStream:
    """What one turn's stream said besides its facts."""

    session_id: str | None = None
    context_tokens: int = 0
    steps: int = 0
    errors: list[str] = field(default_factory=list)
    lines: int = 0
    shell_calls: list[ShellCall] = field(default_factory=list)  # read for the eval result
    results: dict[str, str] = field(default_factory=dict)  # call id -> what OpenCode gives the model as its result
    tool_spans: list[tuple[int, int]] = field(default_factory=list)  # (start, end) ms of every finished call

    def tool_seconds(self) -> float | None:
        """The time some tool call ran (overlapping parallel calls counted once); None without a timed call."""
        if not self.tool_spans:
            return None
        total, reach = 0, None
        for start, end in sorted(self.tool_spans):
            if reach is None or start > reach:
                total, reach = total + end - start, end
            elif end > reach:
                total, reach = total + end - reach, end
        return total / 1000


class StreamParser:
    """Incremental parser for one rollout turn's JSON event stream."""

    def __init__(self, tree_id: str, edge_id: str, turn: int) -> None:
        self.ids = {"tree_id": tree_id, "edge_id": edge_id, "turn": turn}
        self.summary = TurnStream()
        self._step = 0
        self._calls: list[tuple[str, ToolCalled]] = []  # tool calls held: (part id, fact)

    def feed(self, line: str) -> list[Event]:
        """Facts of one line (``[]`` for lines that carry none, such as step_start).

        Tool calls are held until a line of another kind (or :meth:`finish`), then
        given in model order, before that line's facts.
        """
        self.summary.lines += 1
        line_no = self.summary.lines
        text = line.strip()
        if not text:
            return []
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as err:  # also an over-long integer, deep nesting
            why = err.msg if isinstance(err, json.JSONDecodeError) else str(err) or type(err).__name__
            return self.finish() + [self._skip(line_no, f"invalid JSON ({why})", text)]
        if not isinstance(obj, dict):
            return self.finish() + [self._skip(line_no, "not a JSON object", text)]
        kind = obj.get("type")
        if not isinstance(kind, str) or kind not in KNOWN_TYPES:  # a list is not even hashable
            return self.finish() + [self._skip(line_no, f"unknown event type {kind!r}", text)]
        if self.summary.session_id is None and isinstance(obj.get("sessionID"), str):
            self.summary.session_id = obj["sessionID"]
        held = [] if kind == "tool_use" else self.finish()
        try:
            return held + getattr(self, f"_on_{kind}")(obj)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
            return held + [self._skip(line_no, f"malformed {kind} event ({err!r})", text)]

    def finish(self) -> list[Event]:
        """The tool calls held, in the order of their part ids (at the end of a stream too)."""
        held = [fact for _, fact in sorted(self._calls, key=lambda call: call[0])]
        self._calls = []
        return held

    def _skip(self, line_no: int, problem: str, text: str) -> StreamLineSkipped:
        return StreamLineSkipped(**self.ids, line_no=line_no, problem=problem, line=text[:MAX_TEXT])

    def _on_step_start(self, obj: dict) -> list[Event]:
        self._step += 1
        self.summary.steps = self._step
        return []

    def _on_step_finish(self, obj: dict) -> list[Event]:
        part = obj["part"]
        tokens = part.get("tokens") or {}
        cache = tokens.get("cache") or {}
        values = {
            "tokens_input": int(tokens.get("input", 0)),
            "tokens_output": int(tokens.get("output", 0)),
            "tokens_reasoning": int(tokens.get("reasoning", 0)),
            "tokens_cache_read": int(cache.get("read", 0)),
            "tokens_cache_write": int(cache.get("write", 0)),
        }
        # total = prompt + completion when the provider reported usage (facts §5).
        total = tokens.get("total")
        if total is None:
            total = sum(values.values())
        values["tokens_total"] = int(total)
        if not all(fits_int64(v) for v in values.values()):
            raise ValueError("a token count does not fit a 64-bit integer")
        self.summary.context_tokens = values["tokens_total"]
        return [
            StepFinished(
                **self.ids,
                step=max(self._step, 1),
                reason=part.get("reason"),
                cost=float(part.get("cost") or 0.0),
                **values,
            )
        ]

    def _on_tool_use(self, obj: dict) -> list[Event]:
        part = obj["part"]
        state = part.get("state") or {}
        tool = str(part["tool"])
        inputs = state.get("input")
        span = _span(state.get("time"))
        if span is not None and state.get("status") in ("completed", "error"):
            self.summary.tool_spans.append(span)
        if tool in SHELL_TOOLS and state.get("status") == "completed" and isinstance(inputs, dict):
            seconds = (span[1] - span[0]) / 1000 if span else None
            self.summary.shell_calls.append(
                ShellCall(str(inputs.get("command", "")), str(state.get("output") or ""), seconds)
            )
        call_id = str(part.get("callID") or part.get("id"))
        if state.get("status") in ("completed", "error"):  # a finished call: its result, as OpenCode sends it
            self.summary.results[call_id] = str(
                state.get("output") if state["status"] == "completed" else state.get("error") or ""
            )
        failed = state.get("status") == "error" or tool == "invalid"
        error = state.get("error") if state.get("status") == "error" else None
        if tool == "invalid" and error is None:
            error = str(state.get("output") or (state.get("input") or {}).get("error") or "")
        fact = ToolCalled(
            **self.ids,
            step=max(self._step, 1),
            call_id=call_id,
            tool=tool,
            status="error" if failed else "ok",
            target=_clip(tool_target(tool, state.get("input"))),
            error=_clip(error),
        )
        self._calls.append((str(part.get("id") or ""), fact))  # a stable sort keeps id-less ones in turn
        return []

    def _on_text(self, obj: dict) -> list[Event]:
        return [MessageWritten(**self.ids, step=max(self._step, 1), part="text", text=str(obj["part"].get("text", "")))]

    def _on_reasoning(self, obj: dict) -> list[Event]:
        return [
            MessageWritten(**self.ids, step=max(self._step, 1), part="reasoning", text=str(obj["part"].get("text", "")))
        ]

    def _on_error(self, obj: dict) -> list[Event]:
        err = obj.get("error") or {}
        data = err.get("data") or {}
        self.summary.errors.append(f"{err.get('name', 'Error')}: {data.get('message', '')}".strip())
        return []


def _span(time: Any) -> tuple[int, int] | None:
    """A part's ``time`` ({start, end} in ms) as a span, None when it is not a sane one."""
    if not isinstance(time, dict):
        return None
    start, end = time.get("start"), time.get("end")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 for v in (start, end))
    return (start, end) if ok and start <= end else None


def _clip(value: str | None) -> str | None:
    return value if value is None or len(value) <= MAX_TEXT else value[:MAX_TEXT] + "…"


def session_lines(messages: list[dict[str, Any]]) -> list[str]:
    """The lines ``opencode run --format json`` prints for the last prompt of a stored session.

    ``messages`` is the session as ``GET /session/{id}/message`` gives it (``info`` and
    ``parts`` each). What follows its last user message is the turn: every assistant
    message's parts in order - ``step-start``, ``tool`` once finished (completed or
    error), ``text`` once complete, ``step-finish`` - and its ``error``, as ``run``
    prints them (``reasoning`` only with ``--thinking``, which turns do not use; a
    running tool or a text cut off are never printed). Parallel calls come in the
    model's order here, where ``run`` prints them as they finish.
    """
    last_user = max((i for i, m in enumerate(messages) if (m.get("info") or {}).get("role") == "user"), default=-1)
    lines: list[str] = []
    for message in messages[last_user + 1 :]:
        info = message.get("info") or {}
        session = info.get("sessionID")
        for part in message.get("parts") or []:
            kind = part.get("type")
            state = part.get("state") or {}
            if kind == "step-start":
                name = "step_start"
            elif kind == "step-finish":
                name = "step_finish"
            elif kind == "tool" and state.get("status") in ("completed", "error"):
                name = "tool_use"
            elif kind == "text" and (part.get("time") or {}).get("end") is not None:
                name = "text"
            else:
                continue
            stamp = (part.get("time") or state.get("time") or {}).get("end") or (info.get("time") or {}).get("created")
            lines.append(json.dumps({"type": name, "timestamp": stamp, "sessionID": session, "part": part}) + "\n")
        if info.get("error"):
            stamp = (info.get("time") or {}).get("completed") or (info.get("time") or {}).get("created")
            error = {"type": "error", "timestamp": stamp, "sessionID": session, "error": info["error"]}
            lines.append(json.dumps(error) + "\n")
    return lines


def parse_stream(text: str, tree_id: str, edge_id: str, turn: int) -> tuple[list[Event], TurnStream]:
    """Facts and summary of a whole stream."""
    parser = StreamParser(tree_id, edge_id, turn)
    facts: list[Event] = []
    for line in text.splitlines():
        facts.extend(parser.feed(line))
    facts.extend(parser.finish())
    return facts, parser.summary
