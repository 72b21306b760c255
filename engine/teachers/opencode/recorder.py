"""What the model received: a recording pass-through on loopback between OpenCode and the endpoint.

OpenCode's stream and its session store hold neither the system prompt nor the tool
definitions it sends, and a turn killed in the middle of a tool call prints nothing
of that call. Every turn's OpenCode therefore talks to the endpoint through this
server (``http://127.0.0.1:<port>/turn/<token>``, one token per turn; a served turn's
requests come to ``/served`` and belong to the turn their ``x-session-id`` is bound to): each request
is forwarded as it is, its answer streamed back as it arrives, and both are kept
for the turn (never a header: the API key stays out of everything recorded). Each forwarded
request gains the header ``X-Teacher-MCTS-Turn: <edge id> <turn>``, so the endpoint (its logs, a
scripted model in the tests) knows which turn asks while the prompts the model reads name none: the
attempts from one node all receive the same prompt.

When the turn ends, :func:`conversation_facts` makes its facts from the requests of
its session (the first agent request's session; title requests, which offer no
tools, and requests the endpoint refused, which OpenCode repeats, left out): the
last request's system messages and tools (``ContentRecorded``) and its messages,
with the model's answer when it finished one (``ConversationRecorded``). The
conversation a turn inherits is not recorded again: the turn's checkpoint carries
the length and digest of its conversation, and a turn whose first request begins
with exactly that records only what follows (``base``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ingest.events import ConversationRecorded, Event, StepFinished, canonical_json, content_fact

RECORDER = "opencode-proxy"
# What OpenCode sends the model for a tool call that a killed turn never finished
# (measured on 1.18.33: a forked session's first request), in place of its result.
INTERRUPTED = "[Tool execution was interrupted]"
HOP_HEADERS = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "accept-encoding",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
}
TURN_HEADER = "X-Teacher-MCTS-Turn"  # the turn a forwarded request belongs to: "<edge id> <turn>"
PATH_RE = re.compile(r"^/turn/([0-9a-f]+)(/.*)$")
SERVED_RE = re.compile(r"^/served(/.*)$")  # one server's requests: the turn is its session's (``bind``)


@dataclass
class Exchange:
    """One request of a turn: its session, body, the endpoint's status and the model's answer."""

    session: str | None
    request: dict[str, Any] | None
    status: int | None = None  # the endpoint's HTTP status; None when it never answered (cut off)
    answer: dict[str, Any] | None = None  # None until the model finished answering
    usage: dict[str, Any] | None = None  # the endpoint's ``usage`` of that answer, when it sent one
    started: float = field(default_factory=time.monotonic)  # when OpenCode sent it
    ended: float | None = None  # when its answer ended (or was cut off)


class Recorder:
    """The pass-through server (see the module docstring); ``timeout_s`` bounds a silent endpoint."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        self.endpoint = urlsplit(endpoint.rstrip("/"))
        self.timeout_s = timeout_s
        self._turns: dict[str, list[Exchange]] = {}
        self._upstream: dict[str, list[http.client.HTTPConnection]] = {}
        self._active: dict[str, int] = {}  # requests of a turn being forwarded
        self._sessions: dict[str, str] = {}  # a served turn's session (and its subagents') -> its token
        self._labels: dict[str, str] = {}  # a turn's token -> its TURN_HEADER value
        self.parent_of: Callable[[str], str | None] | None = None  # a subagent session's parent (the server's)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="recorder", daemon=True).start()

    def open(self, edge_id: str | None = None, turn: int | None = None) -> str:
        """A new turn's token; its OpenCode's base URL is :meth:`url`. Its requests reach the endpoint
        with ``TURN_HEADER`` naming ``edge_id`` and ``turn`` (when given)."""
        token = uuid.uuid4().hex
        with self._lock:
            self._turns[token] = []
            self._upstream[token] = []
            if edge_id is not None:
                self._labels[token] = f"{edge_id} {turn}"
        return token

    def url(self, token: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/turn/{token}"

    def served_url(self) -> str:
        """The base URL of a server's requests: each belongs to the turn its session is bound to."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/served"

    def bind(self, token: str, session: str) -> None:
        """The requests of ``session`` (and of the subagents it starts) are the turn ``token``'s."""
        with self._lock:
            self._sessions[session] = token

    def _token_of(self, session: str | None) -> str | None:
        """The turn a served request belongs to: its session's, else its parent session's."""
        seen: list[str] = []
        while session and len(seen) < 8:
            with self._lock:
                token = self._sessions.get(session)
            if token is not None:
                with self._lock:
                    for s in seen:
                        self._sessions[s] = token
                return token
            seen.append(session)
            session = self.parent_of(session) if self.parent_of else None
        return None

    def close(self, token: str, grace_s: float = 5.0) -> list[Exchange]:
        """The turn's exchanges, once the requests it forwards have ended.

        OpenCode may exit as soon as it has read the last answer, before the thread
        that forwarded it has kept it: a request still being forwarded is given
        ``grace_s`` to end, then cut off (an endpoint still silent when a turn was
        killed) and given as long again.
        """
        with self._idle:
            self._idle.wait_for(lambda: not self._active.get(token), timeout=grace_s)
            upstream = list(self._upstream.get(token, []))
        for conn in upstream:
            with contextlib.suppress(OSError):
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
        with self._idle:
            self._idle.wait_for(lambda: not self._active.get(token), timeout=grace_s)
            exchanges = self._turns.pop(token, [])
            self._upstream.pop(token, None)
            self._active.pop(token, None)
            self._labels.pop(token, None)
            for session in [s for s, t in self._sessions.items() if t == token]:
                del self._sessions[session]
        return exchanges

    def first_request(self, token: str) -> float | None:
        """When the turn's first request to the model came (``time.monotonic()``), None before it."""
        with self._lock:
            found = [x.started for x in self._turns.get(token, []) if x.request and x.request.get("tools")]
        return min(found, default=None)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the handler's side

    def _begin(self, token: str, session: str | None, body: bytes) -> Exchange | None:
        try:
            request = json.loads(body) if body else None
        except ValueError:
            request = None
        exchange = Exchange(session, request if isinstance(request, dict) else None)
        with self._lock:
            if token not in self._turns:
                return None
            self._turns[token].append(exchange)
            self._active[token] = self._active.get(token, 0) + 1
        return exchange

    def _end(self, token: str, exchange: Exchange) -> None:
        exchange.ended = time.monotonic()
        with self._idle:
            if token in self._active:
                self._active[token] -= 1
            self._idle.notify_all()

    def _connect(self, token: str) -> http.client.HTTPConnection:
        port = self.endpoint.port
        if self.endpoint.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.endpoint.hostname, port, timeout=self.timeout_s
            )
        else:
            conn = http.client.HTTPConnection(self.endpoint.hostname, port, timeout=self.timeout_s)
        with self._lock:
            if token in self._upstream:  # a turn's, cut off when it ends
                self._upstream[token].append(conn)
        return conn


class _Server(ThreadingHTTPServer):
    """Connections of every turn at once: a listen queue of the default 5 overflows at a width of 64 (the
    kernel then drops a connection the client thinks is open: its request sent, never read)."""

    request_queue_size = 1024


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_POST(self) -> None:  # http.server naming
            self._forward("POST")

        def do_GET(self) -> None:
            self._forward("GET")

        def _forward(self, method: str) -> None:
            found = PATH_RE.match(self.path)
            served = SERVED_RE.match(self.path)
            if found:
                token, rest = found[1], found[2]
            elif served:
                token, rest = recorder._token_of(self.headers.get("x-session-id")) or "", served[1]
            else:
                self._fail(404, f"no turn in {self.path}")
                return
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            exchange = recorder._begin(token, self.headers.get("x-session-id"), body)
            try:
                self._relay(method, token, rest, body, exchange)
            finally:
                if exchange is not None:
                    recorder._end(token, exchange)

        def _relay(self, method: str, token: str, rest: str, body: bytes, exchange: Exchange | None) -> None:
            conn = recorder._connect(token)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Accept-Encoding"] = "identity"  # the answer is read as it streams
            with recorder._lock:
                label = recorder._labels.get(token)
            if label is not None:
                headers[TURN_HEADER] = label
            try:
                conn.request(method, recorder.endpoint.path + rest, body=body or None, headers=headers)
            except (OSError, http.client.HTTPException) as err:  # never sent: the model received nothing
                conn.close()
                self._fail(502, f"the endpoint {recorder.endpoint.geturl()} did not answer: {err}", exchange)
                return
            try:
                answer = conn.getresponse()
            except (OSError, http.client.HTTPException) as err:
                # Sent, and cut off before any answer (a turn killed while the endpoint was
                # silent): the model received it, so no status marks it refused.
                conn.close()
                self._fail(502, f"the endpoint {recorder.endpoint.geturl()} did not answer: {err}")
                return
            if exchange is not None:
                exchange.status = answer.status
            received = bytearray()
            try:
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_HEADERS:
                        self.send_header(key, value)
                self.end_headers()
                while chunk := answer.read1(65536):
                    received += chunk
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, http.client.HTTPException):  # OpenCode went away (a killed turn), or cut off
                pass
            finally:
                conn.close()
            if exchange is not None and answer.status < 400:
                exchange.answer = parse_answer(bytes(received))
                exchange.usage = parse_usage(bytes(received))

        def _fail(self, status: int, message: str, exchange: Exchange | None = None) -> None:
            if exchange is not None:
                exchange.status = status
            payload = json.dumps({"error": {"message": message}}).encode()
            with contextlib.suppress(OSError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

    return Handler


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    """The chunks of an answer: its SSE ``data:`` lines, or one JSON body as a chunk."""
    text = raw.decode("utf-8", errors="replace")
    chunks: list[dict[str, Any]] = []
    if text.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            body = json.loads(text)
            choice = (body.get("choices") or [{}])[0]
            delta = choice.get("message") or {}
            chunks = [
                {
                    "choices": [{"delta": delta, "finish_reason": choice.get("finish_reason")}],
                    "usage": body.get("usage"),
                }
            ]
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            with contextlib.suppress(ValueError):
                chunk = json.loads(line[5:])
                if isinstance(chunk, dict):
                    chunks.append(chunk)
    return chunks


def parse_usage(raw: bytes) -> dict[str, Any] | None:
    """The last ``usage`` object of an answer (the endpoint's token counts), None without one."""
    found = [c["usage"] for c in _chunks(raw) if isinstance(c.get("usage"), dict)]
    return found[-1] if found else None


def parse_answer(raw: bytes) -> dict[str, Any] | None:
    """The assistant message of a finished answer (SSE chunks or one JSON body); None if unfinished.

    In the form OpenCode sends it back in later requests: ``content`` (``""`` without
    text), ``reasoning_content`` when there is reasoning, ``tool_calls`` with their
    arguments as compact JSON.
    """
    chunks = _chunks(raw)
    content, reasoning, finished = [], [], False
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for i, call in enumerate(delta.get("tool_calls") or []):
                slot = calls.setdefault(call.get("index", i), {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            finished = finished or bool(choice.get("finish_reason"))
    if not finished:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if "".join(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _compact(c["arguments"])}}
            for _, c in sorted(calls.items())
        ]
    return message


def _compact(arguments: str) -> str:
    """Tool-call arguments as OpenCode sends them back: the parsed JSON, compact (else as given)."""
    try:
        return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return arguments


def digest(messages: list[dict[str, Any]]) -> str:
    """The digest of a conversation a checkpoint carries (to recognise it in a fork's request)."""
    return hashlib.sha256(canonical_json(messages).encode()).hexdigest()[:32]


def conversation_facts(
    exchanges: list[Exchange],
    ids: dict[str, Any],
    inherited: dict[str, Any] | None,
    workspace: str,
    results: dict[str, str] | None = None,
) -> tuple[list[Event], dict[str, Any]]:
    """A turn's ContentRecorded and ConversationRecorded facts, and its conversation's checkpoint.

    ``results`` are the outputs of the tool calls the turn's stream showed finished, by
    call id. A turn that ended while the calls of its last answer ran (killed) records,
    after the answer, the tool messages OpenCode sends when the session goes on: a
    finished call's output, :data:`INTERRUPTED` for the others.
    """
    agent = agent_exchanges(exchanges)
    inherited = inherited or {}
    length = int(inherited.get("messages") or 0)
    if not agent:  # no model call: the conversation is the inherited one
        return [
            ConversationRecorded(**ids, base=length, turn_start=length, workspace=workspace, recorder=RECORDER)
        ], dict(inherited)
    first, last = agent[0].request["messages"], agent[-1].request["messages"]
    lead = next((i for i, m in enumerate(last) if m.get("role") != "system"), len(last))
    system, rest = last[:lead], last[lead:]
    first_rest = first[next((i for i, m in enumerate(first) if m.get("role") != "system"), len(first)) :]
    answer = agent[-1].answer
    conversation = rest + ([answer] if answer else []) + _continuation(answer, results or {})
    base = length if length and len(rest) >= length and digest(rest[:length]) == inherited.get("sha") else 0
    system_fact, tools_fact = content_fact("system", system), content_fact("tools", agent[-1].request["tools"])
    recorded = ConversationRecorded(
        **ids,
        system_id=system_fact.content_id,
        tools_id=tools_fact.content_id,
        base=base,
        turn_start=max(len(first_rest) - 1, 0),
        model_calls=len(agent),
        workspace=workspace,
        recorder=RECORDER,
        messages=conversation[base:],
    )
    return [system_fact, tools_fact, recorded], {"messages": len(conversation), "sha": digest(conversation)}


def agent_exchanges(exchanges: list[Exchange]) -> list[Exchange]:
    """The requests of the turn's own session that the model received (see the module docstring)."""
    agent = [
        x
        for x in exchanges
        if x.request
        and x.request.get("tools")
        and isinstance(x.request.get("messages"), list)
        and (x.status or 0) < 400
    ]
    return [x for x in agent if x.session == agent[0].session] if agent else []


def _continuation(answer: dict[str, Any] | None, results: dict[str, str]) -> list[dict[str, Any]]:
    """The tool messages that follow a last answer's calls when the session goes on."""
    calls = (answer or {}).get("tool_calls") or []
    return [{"role": "tool", "tool_call_id": c["id"], "content": results.get(c["id"], INTERRUPTED)} for c in calls]


def model_phases(exchanges: list[Exchange], t0: float) -> tuple[float | None, float | None]:
    """A turn's start-up (from ``t0``, its process start, to its first request to the model) and
    its model time (the requests' durations summed; they do not overlap), None without a request."""
    agent = agent_exchanges(exchanges)
    if not agent:
        return None, None
    model = sum((x.ended or x.started) - x.started for x in agent)
    return round(max(agent[0].started - t0, 0.0), 3), round(model, 3)


def unreported_steps(exchanges: list[Exchange], ids: dict[str, Any], reported: set[int]) -> list[StepFinished]:
    """StepFinished facts, from the endpoint's usage, of the answered model calls the stream never finished.

    OpenCode prints a step's tokens when its tool calls are done: a turn killed during a
    call prints none for that model call, though the endpoint answered it. Step ``n``
    is the ``n``-th request the model received; ``reported`` are the steps the stream
    finished. A request the model never answered is no step (nor, as it has no tokens to
    give, an answer that came without the endpoint's usage). The split is OpenCode's:
    input without the cached tokens, output without the reasoning ones.
    """
    facts = []
    for step, exchange in enumerate(agent_exchanges(exchanges), start=1):
        usage = exchange.usage
        if step in reported or exchange.answer is None or not usage:
            continue
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        cached = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        reasoning = _count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))
        total = _count(usage.get("total_tokens")) or prompt + completion
        facts.append(
            StepFinished(
                **ids,
                step=step,
                reason="unreported",
                tokens_input=max(prompt - cached, 0),
                tokens_output=max(completion - reasoning, 0),
                tokens_reasoning=reasoning,
                tokens_cache_read=cached,
                tokens_total=total,
            )
        )
    return facts


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62 else 0
