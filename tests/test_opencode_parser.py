"""The `opencode run --format json` stream parser, on the event shapes OpenCode 1.18.33 prints."""

from __future__ import annotations

import json

from ingest.events import MessageWritten, StepFinished, StreamLineSkipped, ToolCalled
from ingest.opencode_stream import StreamParser, parse_stream, session_lines, tool_target

SES = "ses_dd5ab1ccfffeR0BpNUhn009su1"


def line(kind: str, part: dict | None = None, **extra) -> str:
    obj = {"type": kind, "timestamp": 1796006538884, "sessionID": SES}
    if part is not None:
        obj["part"] = part
    obj.update(extra)
    return json.dumps(obj)


def tool(name: str, status: str, inputs: dict, **state) -> str:
    return line(
        "tool_use",
        {"type": "tool", "tool": name, "callID": f"call_{name}", "state": {"status": status, "input": inputs, **state}},
    )


STREAM = [
    line("step_start", {"type": "step-start"}),
    tool(
        "bash", "completed", {"command": "echo hello > out.txt && cat out.txt"}, output="hello\n", metadata={"exit": 0}
    ),
    tool(
        "read",
        "error",
        {"filePath": "/tmp/repo/does_not_exist.txt"},
        error="File not found: /tmp/repo/does_not_exist.txt",
    ),
    line(
        "step_finish",
        {
            "type": "step-finish",
            "reason": "tool-calls",
            "cost": 0.002958,
            "tokens": {"total": 1056, "input": 703, "output": 46, "reasoning": 7, "cache": {"write": 0, "read": 300}},
        },
    ),
    line("step_start", {"type": "step-start"}),
    line("reasoning", {"type": "reasoning", "text": "I am reasoning here."}),
    tool(
        "invalid",
        "completed",
        {"tool": "nosuchtool", "error": "unavailable"},
        output="The arguments provided to the tool are invalid",
    ),
    line("text", {"type": "text", "text": "All done. Final answer."}),
    line(
        "step_finish",
        {
            "type": "step-finish",
            "reason": "stop",
            "tokens": {"total": 2100, "input": 1800, "output": 300, "reasoning": 0, "cache": {"write": 0, "read": 0}},
        },
    ),
]


def test_every_event_type_becomes_its_fact():
    facts, summary = parse_stream("\n".join(STREAM), "T1", "T1/e1-1", 1)
    kinds = [type(f) for f in facts]
    assert kinds == [ToolCalled, ToolCalled, StepFinished, MessageWritten, ToolCalled, MessageWritten, StepFinished]
    bash, missing, step1, thought, invalid, text, step2 = facts
    assert (bash.tool, bash.status, bash.target, bash.step) == (
        "bash",
        "ok",
        "echo hello > out.txt && cat out.txt",
        1,
    )
    assert (missing.status, missing.target) == ("error", "/tmp/repo/does_not_exist.txt")
    assert missing.error.startswith("File not found")
    assert (invalid.status, invalid.step) == ("error", 2)  # a tool that does not exist
    assert (step1.tokens_input, step1.tokens_output, step1.tokens_reasoning) == (703, 46, 7)
    assert (step1.tokens_cache_read, step1.tokens_total, step1.cost) == (300, 1056, 0.002958)
    assert (thought.part, text.part, text.text) == ("reasoning", "text", "All done. Final answer.")
    # The session's context is the last step's usage.
    assert (summary.context_tokens, summary.steps, summary.session_id) == (2100, 2, SES)
    assert summary.errors == []


def test_bad_lines_are_recorded_not_fatal():
    lines = [
        STREAM[0],
        '{"type": "tool_use", "part": {"tool": "read"',  # truncated
        "not json at all",
        line("compaction", {"type": "x"}),  # a type this version does not print
        "[1, 2]",
        line("tool_use", {"type": "tool"}),  # no tool name
        "",
        STREAM[1],
        '{"type": "step_finish", "n": 1' + "0" * 5000 + "}",  # more digits than Python reads
        "[" * 100_000 + "]" * 100_000,  # nested deeper than the JSON reader recurses
        line("step_finish", {"type": "step-finish", "tokens": {"input": 2**64, "output": 1}}),
        line("step_finish", {"type": "step-finish", "tokens": {"total": float("inf")}}),
    ]
    parser = StreamParser("T1", "T1/e1-1", 2)
    facts = [f for raw in lines for f in parser.feed(raw)]
    skipped = [f for f in facts if isinstance(f, StreamLineSkipped)]
    assert [s.line_no for s in skipped] == [2, 3, 4, 5, 6, 9, 10, 11, 12]
    assert skipped[0].problem.startswith("invalid JSON")
    assert skipped[2].problem == "unknown event type 'compaction'"
    assert skipped[3].problem == "not a JSON object"
    assert skipped[4].problem.startswith("malformed tool_use event")
    assert skipped[5].problem.startswith("invalid JSON") and skipped[6].problem.startswith("invalid JSON")
    assert skipped[7].problem.startswith("malformed step_finish event") and "64-bit" in skipped[7].problem
    assert skipped[8].problem.startswith("malformed step_finish event")  # an infinite total
    assert not any(isinstance(f, StepFinished) for f in facts)
    assert [f.tool for f in facts if isinstance(f, ToolCalled)] == ["bash"]
    assert all(s.turn == 2 and s.edge_id == "T1/e1-1" for s in skipped)


def test_error_events_are_collected_for_the_turn():
    err = line("error", error={"name": "APIError", "data": {"message": "bad key", "statusCode": 401}})
    facts, summary = parse_stream(err, "T1", "T1/e1-1", 1)
    assert facts == [] and summary.errors == ["APIError: bad key"]


def test_usage_without_total_is_summed_and_missing_usage_is_zero():
    no_total = line("step_finish", {"type": "step-finish", "tokens": {"input": 10, "output": 5}})
    empty = line("step_finish", {"type": "step-finish"})
    facts, summary = parse_stream(f"{no_total}\n{empty}", "T1", "T1/e1-1", 1)
    assert [f.tokens_total for f in facts] == [15, 0]
    assert summary.context_tokens == 0


def test_tool_targets():
    assert tool_target("grep", {"pattern": "TILE", "path": ".opencode/skills"}) == ".opencode/skills TILE"
    assert tool_target("edit", {"filePath": "/w/a.py", "oldString": "x"}) == "/w/a.py"
    assert tool_target("skill", {"name": "profile-kernel"}) == "profile-kernel"
    assert tool_target("todowrite", {"todos": []}) is None
    assert tool_target("bash", "not a dict") is None


def test_the_eval_result_survives_hostile_stream_lines_and_attempt_files(tmp_path):
    """The printed block is read from the shell calls the stream parser kept; hostile lines
    and attempt files give no result rather than an exception."""
    from ingest import coral_eval

    block = "CORAL Eval (#3): 0.75\nCommit: abc1234\nStatus: improved\nFeedback: faster"
    good = json.dumps(
        {
            "type": "tool_use",
            "part": {
                "tool": "bash",
                "callID": "c1",
                "state": {"status": "completed", "input": {"command": "coral eval -m 'x'"}, "output": block},
            },
        }
    )
    hostile = [
        '{"n": 1' + "0" * 5000 + "}",  # more digits than Python's JSON reader takes
        "[" * 100_000 + "]" * 100_000,  # nesting deeper than it recurses
        '{"part": 5}',
        '{"type": "tool_use", "part": {"tool": "bash", "state": [1]}}',
        '{"type": "tool_use", "part": {"tool": "bash", "state": {"status": "completed", "input": "coral"}}}',
        "[1]",
    ]
    _, summary = parse_stream("\n".join([good, *hostile]), "T1", "T1/e1-1", 1)
    printed = coral_eval.from_printed(summary.shell_calls, "coral")
    assert printed == coral_eval.EvalResult(0.75, "improved", "faster", "printed_block")
    assert coral_eval.from_printed(summary.shell_calls, "grade") is None  # another eval command
    failed = block.replace("0.75", "FAILED")
    calls = [coral_eval.ShellCall("coral eval -m y", failed)]
    assert coral_eval.from_printed(calls, "coral") == coral_eval.EvalResult(None, "improved", "faster", "printed_block")
    uncounted = block.replace("CORAL Eval (#3):", "CORAL Eval:")  # CORAL read its counter mid-write
    assert coral_eval.from_printed([coral_eval.ShellCall("coral eval -m z", uncounted)], "coral") == printed
    still = "CORAL Eval: STILL PENDING\nGrader did not finalize attempt abc within 300s\n"
    assert coral_eval.from_printed([coral_eval.ShellCall("coral eval -m z", still)], "coral") is None
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    for name, raw in (
        ("deep", b"[" * 100_000),
        ("latin1", b'{"score": "\xe9"}'),
        ("long", b'{"score": 1' + b"0" * 5000 + b"}"),
        ("list", b"[1]"),
    ):
        (attempts / f"{name}.json").write_bytes(raw)
        got = coral_eval.from_attempt(attempts / f"{name}.json")
        assert got is None or got.score is None, name
    (attempts / "ok.json").write_text(json.dumps({"score": 0.5, "status": "baseline", "feedback": "same"}))
    ok = coral_eval.EvalResult(0.5, "baseline", "same", "attempt_json")
    assert coral_eval.from_attempt(attempts / "ok.json") == ok
    assert coral_eval.from_attempt(attempts / "missing.json") is None


def parallel_call(call: str, part_id: str) -> str:
    return line(
        "tool_use",
        {
            "type": "tool",
            "tool": "read",
            "callID": call,
            "id": part_id,
            "state": {"status": "completed", "input": {"filePath": call}, "output": "x"},
        },
    )


def test_parallel_calls_come_in_the_order_the_model_made_them():
    """OpenCode prints parallel calls as they finish; their part ids follow the model's order."""
    stream = [
        line("step_start", {"type": "step-start"}),
        parallel_call("call_c", "prt_0003"),
        parallel_call("call_a", "prt_0001"),
        parallel_call("call_b", "prt_0002"),
        line("step_finish", {"type": "step-finish", "reason": "tool-calls", "tokens": {"total": 10}}),
        line("step_start", {"type": "step-start"}),
        parallel_call("call_e", "prt_0005"),
        parallel_call("call_d", "prt_0004"),  # the stream ends here (killed)
    ]
    facts, _ = parse_stream("\n".join(stream), "T1", "T1/e1-1", 1)
    assert [(type(f).__name__, getattr(f, "call_id", None)) for f in facts] == [
        ("ToolCalled", "call_a"),
        ("ToolCalled", "call_b"),
        ("ToolCalled", "call_c"),
        ("StepFinished", None),
        ("ToolCalled", "call_d"),
        ("ToolCalled", "call_e"),
    ]
    parser = StreamParser("T1", "T1/e1-1", 1)
    held = [parser.feed(x) for x in stream]
    assert held[1:4] == [[], [], []]  # held until a line of another kind
    assert [f.call_id for f in parser.finish()] == ["call_d", "call_e"]


def test_a_line_a_fuzzer_found_is_a_recorded_skip_or_a_storable_fact():
    """`{"type": []}` raised TypeError (a list is not hashable); a lone surrogate escape
    (a model's half emoji) made a fact the log could not store (UnicodeEncodeError)."""
    from datetime import UTC, datetime

    from ingest.schema import to_arrow

    parser = StreamParser("T1", "T1/e1-1", 1)
    (skip,) = parser.feed('{"type": []}')
    assert isinstance(skip, StreamLineSkipped) and skip.problem == "unknown event type []"
    facts = parser.feed(line("text", {"type": "text", "text": "half \ud83d"})) + parser.feed(
        line("tool_use", {"tool": "bash", "state": {"status": "completed", "input": {"command": "echo \ud800"}}})
    )
    facts += parser.finish()  # a tool call is held until a line of another kind
    table = to_arrow(facts, "r", 1, datetime.now(UTC))
    assert table.column("text").to_pylist() == ["half \ufffd", None]
    assert table.column("target").to_pylist() == [None, "echo \ufffd"]


def test_a_turn_s_tool_and_eval_time_come_from_its_calls_spans():
    """Parallel calls count once; a span that is not one (missing, reversed, a string) counts nothing."""
    from ingest.coral_eval import eval_seconds

    t0 = 1796006538000
    stream = [
        tool("read", "completed", {"filePath": "/a"}, output="a", time={"start": t0, "end": t0 + 1000}),
        tool("grep", "error", {"pattern": "x"}, error="bad", time={"start": t0 + 500, "end": t0 + 2000}),
        tool(
            "bash",
            "completed",
            {"command": 'coral eval -m "x"'},
            output="",
            time={"start": t0 + 3000, "end": t0 + 3500},
        ),
        tool("bash", "completed", {"command": "ls"}, output="", time={"start": t0 + 4000, "end": t0 + 3900}),
        tool("bash", "completed", {"command": "coral eval -m y"}, output="", time={"start": "0", "end": t0}),
        tool("glob", "running", {"pattern": "*"}, time={"start": t0 + 5000, "end": t0 + 9000}),
    ]
    _, summary = parse_stream("\n".join(stream), "T", "T/e1-1", 1)
    assert summary.tool_seconds() == 2.5
    assert eval_seconds(summary.shell_calls, "coral") == 0.5
    assert eval_seconds(summary.shell_calls, "local-eval") is None
    assert parse_stream(tool("read", "completed", {}, output=""), "T", "T/e1-1", 1)[1].tool_seconds() is None


def test_a_stored_session_gives_the_lines_run_prints_for_its_last_prompt():
    """Only what follows the last user message; finished tools and complete texts only; steps
    in order; an answer's error as an error line - and the parser reads them as a run's stream."""
    ses = "ses_x"

    def message(role, parts, **info):
        return {"info": {"role": role, "sessionID": ses, "time": {"created": 1}, **info}, "parts": parts}

    tool = {"type": "tool", "tool": "bash", "callID": "c1", "id": "prt_2"}
    messages = [
        message("user", [{"type": "text", "text": "earlier prompt"}]),
        message("assistant", [{"type": "text", "text": "inherited", "time": {"start": 1, "end": 2}}]),
        message("user", [{"type": "text", "text": "[edge e turn 1]"}]),
        message(
            "assistant",
            [
                {"type": "step-start", "id": "prt_1"},
                dict(tool, state={"status": "completed", "input": {"command": "ls"}, "output": "a\n"}),
                dict(tool, callID="c2", id="prt_3", state={"status": "running", "input": {"command": "sleep 9"}}),
                {"type": "text", "text": "cut off", "time": {"start": 5}},
                {"type": "reasoning", "text": "thinking", "time": {"start": 5, "end": 6}},
                {"type": "patch", "hash": "h"},
                {"type": "step-finish", "reason": "tool-calls", "tokens": {"input": 10, "output": 2}},
            ],
        ),
        message("assistant", [], error={"name": "APIError", "data": {"message": "bad key"}}),
    ]
    lines = session_lines(messages)
    assert [json.loads(line)["type"] for line in lines] == ["step_start", "tool_use", "step_finish", "error"]
    assert all(json.loads(line)["sessionID"] == ses for line in lines)
    facts, summary = parse_stream("".join(lines), "T", "T/e", 1)
    assert [(f.tool, f.target) for f in facts if isinstance(f, ToolCalled)] == [("bash", "ls")]
    assert [f.tokens_input for f in facts if isinstance(f, StepFinished)] == [10]
    assert summary.errors == ["APIError: bad key"] and summary.session_id == ses
    assert session_lines([]) == [] and session_lines(messages[:3]) == []
