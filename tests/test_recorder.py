"""The OpenCode backend's recording pass-through, against the scripted model server over real HTTP."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from fake_model import FakeModel

from engine.teachers.opencode.recorder import Recorder, conversation_facts, digest, parse_answer
from ingest.events import ContentRecorded, ConversationRecorded

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}]
SYSTEM = {"role": "system", "content": "You are a test. Working directory: /w"}


def script(edge: str, turn: int, step: int, workdir: str):
    return [("read", {"filePath": "/w/a.py"}), ("read", {"filePath": "/w/b.py"})] if step == 0 else "All done."


def post(url: str, body: dict, session: str = "ses_1") -> tuple[int, bytes]:
    parts = urlsplit(url + "/chat/completions")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request(
        "POST",
        parts.path,
        body=json.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-secret", "x-session-id": session},
    )
    answer = conn.getresponse()
    return answer.status, answer.read()


@pytest.fixture
def model():
    server = FakeModel(script).start()
    yield server
    server.stop()


def request(*messages: dict) -> dict:
    return {"model": "fake", "stream": True, "tools": TOOLS, "messages": [SYSTEM, *messages]}


def test_requests_pass_through_unchanged_and_are_kept_without_headers(model):
    recorder = Recorder(model.base_url, timeout_s=30)
    try:
        token = recorder.open("T1/e1-1", 1)
        user = {"role": "user", "content": "Go"}
        status, streamed = post(recorder.url(token), request(user))
        exchanges = recorder.close(token)
    finally:
        recorder.stop()
    assert status == 200 and streamed.startswith(b"data: ") and streamed.endswith(b"data: [DONE]\n\n")
    # The endpoint learns the turn from a header (the prompt names no attempt).
    assert model.requests[0]["where"] == {"edge": "T1/e1-1", "turn": 1, "step": 0}
    assert model.requests[0]["messages"][1] == user
    assert model.requests[0]["authorization"] == "Bearer sk-secret"  # forwarded to the endpoint...
    assert "sk-secret" not in repr(exchanges)  # ...and kept nowhere
    (exchange,) = exchanges
    assert exchange.session == "ses_1" and exchange.status == 200
    assert exchange.request["messages"][1] == user
    # The answer in the form OpenCode sends it back: compact arguments, content "" without text.
    assert exchange.answer == parse_answer(streamed)
    calls = exchange.answer["tool_calls"]
    assert exchange.answer["content"] == "" and [c["function"]["arguments"] for c in calls] == [
        '{"filePath":"/w/a.py"}',
        '{"filePath":"/w/b.py"}',
    ]


def test_a_refused_request_is_recorded_with_its_status_and_an_unanswering_endpoint_is_a_502():
    refusing = FakeModel(script, fail_status=404).start()
    recorder = Recorder(refusing.base_url, timeout_s=30)
    try:
        token = recorder.open()
        status, body = post(recorder.url(token), request({"role": "user", "content": "x"}))
        (exchange,) = recorder.close(token)
    finally:
        recorder.stop()
        refusing.stop()
    assert status == 404 and b"model not found" in body
    assert exchange.status == 404 and exchange.answer is None
    gone = Recorder("http://127.0.0.1:9/v1", timeout_s=5)  # nothing listens on port 9
    try:
        token = gone.open()
        status, body = post(gone.url(token), request({"role": "user", "content": "x"}))
        (exchange,) = gone.close(token)
    finally:
        gone.stop()
    assert status == 502 and b"did not answer" in body and exchange.status == 502


def test_a_fork_records_only_what_it_adds_to_the_conversation_it_inherited(model):
    recorder = Recorder(model.base_url, timeout_s=30)
    ids = {"tree_id": "T1", "edge_id": "T1/e1-1", "turn": 1}
    try:
        token = recorder.open("T1/e1-1", 1)
        user = {"role": "user", "content": "Go"}
        post(recorder.url(token), request(user))
        post(recorder.url(token), {"model": "fake", "messages": [SYSTEM, user]}, session="ses_1")  # a title call
        first = recorder.close(token)
    finally:
        recorder.stop()
    facts, state = conversation_facts(first, ids, None, "/w")
    system, tools, recorded = facts
    assert isinstance(system, ContentRecorded) and json.loads(system.body) == [SYSTEM]
    assert isinstance(tools, ContentRecorded) and json.loads(tools.body) == TOOLS
    assert isinstance(recorded, ConversationRecorded)
    assert (recorded.base, recorded.turn_start, recorded.model_calls) == (0, 0, 1)  # the title call is not one
    # The turn ended while its calls ran: after the answer, what OpenCode sends on, the
    # finished call's output and the interrupted text for the other.
    answer = first[0].answer
    a, b = (c["id"] for c in answer["tool_calls"])
    results = [
        {"role": "tool", "tool_call_id": a, "content": "a's output"},
        {"role": "tool", "tool_call_id": b, "content": "[Tool execution was interrupted]"},
    ]
    facts, state = conversation_facts(first, ids, None, "/w", {a: "a's output"})
    assert facts[2].messages == [user, answer, *results]
    assert state == {"messages": 4, "sha": digest(facts[2].messages)}
    # The next turn's requests begin with that conversation: only the rest is recorded.
    later = [
        type(first[0])(
            "ses_2",
            request(user, answer, *results, {"role": "user", "content": "again"}),
            200,
            {"role": "assistant", "content": "ok"},
        )
    ]
    _, _, fork = conversation_facts(later, ids | {"turn": 2}, state, "/w")[0]
    assert (fork.base, fork.turn_start) == (4, 4)
    assert fork.messages == [{"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    # Had the fork received another history, it would record the whole conversation.
    other = dict(state, sha="0" * 32)
    _, _, whole = conversation_facts(later, ids | {"turn": 2}, other, "/w")[0]
    assert whole.base == 0 and len(whole.messages) == 6


def test_an_unfinished_answer_is_none_and_reasoning_is_kept():
    chunks = [
        {"choices": [{"delta": {"reasoning_content": "think "}}]},
        {"choices": [{"delta": {"reasoning_content": "more", "content": "Hi"}}]},
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()
    assert parse_answer(stream) is None  # cut off before its finish_reason
    done = stream + b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    assert parse_answer(done) == {"role": "assistant", "content": "Hi", "reasoning_content": "think more"}


def test_a_request_cut_off_before_its_first_byte_is_what_the_model_received_and_usage_makes_steps():
    """A turn killed while the endpoint was silent: its last request carried real tool
    results and must stay the turn's conversation (not 'refused'); the tokens the
    endpoint reported for an answer whose step the stream never printed make a step."""
    from fake_model import Stall

    from engine.teachers.opencode.recorder import unreported_steps

    def stalls(edge, turn, step, workdir):
        return [("read", {"filePath": "/w/a.py"})] if step == 0 else Stall()

    model = FakeModel(stalls).start()
    recorder = Recorder(model.base_url, timeout_s=30)
    ids = {"tree_id": "T1", "edge_id": "T1/e1-1", "turn": 1}
    try:
        token = recorder.open("T1/e1-1", 1)
        user = {"role": "user", "content": "Go"}
        post(recorder.url(token), request(user))
        answer = recorder._turns[token][0].answer
        result = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "a"}
        import threading

        threading.Thread(target=post, args=(recorder.url(token), request(user, answer, result)), daemon=True).start()
        while len(model.requests) < 2:  # the second request reached the endpoint, which stays silent
            threading.Event().wait(0.05)
        exchanges = recorder.close(token, grace_s=0.5)
    finally:
        recorder.stop()
        model.stop()
    assert [x.status for x in exchanges] == [200, None] and exchanges[1].answer is None
    _, _, recorded = conversation_facts(exchanges, ids, None, "/w")[0]
    assert recorded.messages == [user, answer, result] and recorded.model_calls == 2
    assert exchanges[0].usage == model.requests[0]["usage"]
    (step,) = unreported_steps(exchanges, ids, reported=set())
    usage = model.requests[0]["usage"]
    assert (step.step, step.tokens_input, step.tokens_output, step.tokens_total) == (
        1,
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )
    assert unreported_steps(exchanges, ids, reported={1}) == []
