"""A scripted OpenAI-compatible model server for end-to-end tests of the OpenCode backend.

It answers ``POST /v1/chat/completions`` with streamed (SSE) chunks. The recorder in front
of it names the rollout turn of every request in a header (``X-Teacher-MCTS-Turn: <edge id>
<turn>``; the prompts the model reads name nothing, so sibling attempts share them); the server
counts the assistant messages after the conversation's last user message (the turn's prompt)
to know which step of the turn to play. ``script(edge_id, turn, step, workdir)`` returns the step: a list of tool
calls ``(name, arguments)``, a final text, or a misbehaving endpoint: :class:`Stall`
(silent before its first byte, or after its headers) or :class:`Fail` (an HTTP
error). Every request is logged - headers, the whole body as the model received it,
and the usage the server reported for it - so tests compare exports with it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TURN = re.compile(r"^(\S+) (\d+)$")  # the recorder's X-Teacher-MCTS-Turn header
WORKDIR = re.compile(r"Working directory:\s*(\S+)")


@dataclass(frozen=True)
class Stall:
    """Answer nothing until the server stops: before the first byte, or after the headers."""

    after_headers: bool = False


@dataclass(frozen=True)
class Fail:
    """Answer with this HTTP status and an error body."""

    status: int = 500


Step = list[tuple[str, dict[str, Any]]] | str | Stall | Fail
Script = Callable[[str, int, int, str], Step]


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # every turn's connection at once (the default 5 overflows at a width of 64)


class FakeModel:
    """The server; ``start()`` binds 127.0.0.1 on a free port."""

    def __init__(
        self, script: Script, stall: bool = False, fail_status: int | None = None, fail_agent: bool = False
    ) -> None:
        self.script = script
        self.stall = stall  # answer no agent request (one offering tools): a model that never answers a turn
        self.fail_status = fail_status  # answer every request with this HTTP error (a broken endpoint)
        self.fail_agent = fail_agent  # ... only the agent's requests (a server that cannot serve tools)
        self.delay_s = 0.0  # how long each agent request waits before its answer (the model's time)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.calls = 0
        self.stopping = threading.Event()  # releases the stalled answers

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> FakeModel:
        handler = self._handler()
        self.server = _Server(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def first_request_of(self, session_id: str) -> dict[str, Any] | None:
        with self.lock:
            return next((r for r in self.requests if r["session"] == session_id), None)

    def _answer(self, body: dict, turn_header: str | None) -> tuple[Step, dict]:
        messages = body.get("messages", [])
        if not body.get("tools"):  # a title request
            return "Scripted session", {}
        found = TURN.match(turn_header or "")
        if found is None:
            return "No turn named: nothing to do.", {}
        edge, turn = found[1], found[2]
        prompt_at = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        step = sum(1 for m in messages[prompt_at + 1 :] if m.get("role") == "assistant")
        system = " ".join(_text_of(m) for m in messages if m.get("role") == "system")
        workdir = WORKDIR.search(system)
        return self.script(edge, int(turn), step, workdir[1] if workdir else "."), {
            "edge": edge,
            "turn": int(turn),
            "step": step,
        }

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_POST(self) -> None:  # http.server naming
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                step, where = fake._answer(body, self.headers.get("x-teacher-mcts-turn"))
                record = {
                    "session": self.headers.get("x-session-id"),
                    "where": where,
                    "authorization": self.headers.get("authorization"),
                    "body": body,
                    "messages": body.get("messages", []),
                    "tools": bool(body.get("tools")),
                    "tool_list": body.get("tools") or [],
                    "usage": None,
                    "answered": None,
                }
                with fake.lock:
                    fake.calls += 1
                    fake.requests.append(record)
                agent = bool(body.get("tools"))
                if (fake.stall and agent) or isinstance(step, Stall):
                    if isinstance(step, Stall) and step.after_headers:
                        self._headers()
                    fake.stopping.wait()
                    return
                refused = fake.fail_status if agent or not fake.fail_agent else None
                status = refused or (step.status if isinstance(step, Fail) else None)
                if status:
                    record["answered"] = status
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    message = "tools are not supported" if fake.fail_agent else "model not found"
                    self.wfile.write(json.dumps({"error": {"message": message}}).encode())
                    return
                if agent and fake.delay_s:
                    fake.stopping.wait(fake.delay_s)
                self._headers()
                chunks = _chunks(step, body)
                record["usage"], record["answered"] = chunks[-1]["usage"], 200
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _headers(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                self.wfile.flush()

        return Handler


def _chunks(step: Step, body: dict) -> list[dict]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": body.get("model", "fake")}
    prompt = sum(len(json.dumps(m)) for m in body.get("messages", [])) // 4
    out = [base | {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
    if isinstance(step, str):
        out.append(base | {"choices": [{"index": 0, "delta": {"content": step}, "finish_reason": None}]})
        finish, completion = "stop", len(step) // 4 + 1
    else:
        for i, (name, args) in enumerate(step):
            call = {
                "index": i,
                "id": f"call_{abs(hash((name, json.dumps(args)))) % 10**8}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            out.append(base | {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})
        finish, completion = "tool_calls", 20 * len(step)
    out.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    out.append(
        base
        | {
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
    )
    return out
