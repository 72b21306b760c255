"""The export at the edges, where a turn is cut short, against what real OpenCode sent.

Real opencode, real git, the stand-in coral, the scripted model server of
tests/fake_model.py (which keeps every request body and the usage it reported). A
run of three trees' worth of paths (root_children = 3, depth 2) plays one edge case
in the last turn of each leaf (turn 2 of the edge T001.<k>/e1-1):

- run ``cut`` (served, and with a process a turn): a stall before the first byte until
  the turn times out (the request carried two real tool results), a stall after the
  headers, a turn timeout during a hanging call of two parallel calls of which the
  other finished;
- run ``odd`` (a process a turn): kill -9 of the turn's OpenCode during two parallel
  calls of which one finished, an HTTP 500 that OpenCode retries, a call of a tool
  that does not exist.

Each exported sample is compared, message for message, with the last request of its
last turn (what the model received) and the model's answer; what follows a killed
turn's calls is compared with what OpenCode itself sends when the session is forked
(the session of the leaf's last turn is forked and its first request recorded). The
tokens of every model call (ATIF metrics, the turn's context_tokens, the node's tok)
are compared with the usage the server reported.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_model import Fail, FakeModel, Stall
from test_opencode_e2e import coral_on_path, explore_opencode, roots, script, student  # noqa: F401 - fixtures

from cli import cli
from engine.catalog import Catalog
from engine.config import RunConfig
from engine.teachers import TurnRequest
from engine.teachers.opencode import OpenCodeTeacher
from ingest.log import EventLog

INTERRUPTED = "[Tool execution was interrupted]"
TWO_READS = "two reads"  # step 0 of the cut turns: two real, successful tool results


def scenario_script(cases: dict[int, str]):
    """The run's script: the edge case ``cases[k]`` in turn 2 of the edge T001.<k>/e1-1."""
    failed: set[str] = set()

    def play(edge: str, turn: int, step: int, workdir: str):
        found = re.fullmatch(r"T001\.(\d+)/e1-1", edge)
        case = cases.get(int(found[1])) if found and turn == 2 else None
        if edge.endswith("/e9-1"):  # a fork of a leaf's last turn (the comparison's own request)
            return "Forked."
        if case in ("stall-first-byte", "stall-headers"):
            if step == 0:
                return [
                    ("read", {"filePath": f"{workdir}/.opencode/notes/tiling.md"}),
                    ("read", {"filePath": f"{workdir}/solution.py"}),
                ]
            return Stall(after_headers=case == "stall-headers")
        if case == "hanging" and step == 0:
            return [
                ("bash", {"command": "echo finished-call", "description": "echo"}),
                ("bash", {"command": "sleep 600", "description": "hang"}),
            ]
        if case == "kill-9" and step == 0:
            # The echo is done (and printed) long before OpenCode itself is killed.
            return [
                ("bash", {"command": "echo finished-call", "description": "echo"}),
                ("bash", {"command": "sleep 5; kill -9 $PPID; sleep 600", "description": "kill"}),
            ]
        if case == "retry-500" and step == 1 and edge not in failed:
            failed.add(edge)
            return Fail(500)
        if case == "unknown-tool" and step == 0:
            return [("no_such_tool", {"zeta": 1, "alpha": 2})]
        if case == "unknown-tool":
            step -= 1
        return script(edge, turn, step, workdir)

    return play


def run_cases(
    tmp_path: Path,
    roots: Path,  # noqa: F811
    student: Path,  # noqa: F811
    run_id: str,
    cases: dict[int, str],
    timeout: int,
    serve: bool = True,
):
    model = FakeModel(scenario_script(cases)).start()
    config = tmp_path / f"{run_id}.toml"
    config.write_text(
        "parallel = 3\n[tree]\nroot_children = 3\nmax_children = 1\nmax_depth = 2\n"
        f"[backend_options]\nserve = {str(serve).lower()}\n"
    )
    data = tmp_path / "data"
    r = explore_opencode(
        data, roots, model, config, run_id, "--coral-dir", str(student), "--turn-timeout", str(timeout)
    )
    (tmp_path / f"{run_id}-requests.json").write_text(json.dumps(model.requests))  # for a look afterwards
    if r.exit_code != 0:
        model.stop()
    assert r.exit_code == 0, r.output
    return model, data


def exported(data: Path, run_id: str, fmt: str, *extra: str) -> list[dict]:
    out = data.parent / f"{run_id}-{fmt}{'-'.join(extra)}"
    done = CliRunner().invoke(cli, ["--data", str(data), "export", run_id, "--out", str(out), "--format", fmt, *extra])
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in (out / f"{run_id}.{fmt}.jsonl").read_text().splitlines()]


def placer(data: Path, run_id: str):
    worktrees = re.escape(str((data / "runs" / run_id / "worktrees").resolve()))

    def placed(value):  # the placeholder, applied independently of the exporter
        return json.loads(re.sub(worktrees + r"/T001/[^/\"]+/wt", "/workspace", json.dumps(value)))

    return placed


def leaf_turn(cat: Catalog, k: int) -> dict:
    (row,) = cat.query(
        "select t.session_id, t.context_tokens, t.outcome, t.state, n.tok from int_turns as t "
        "join nodes as n on n.edge_id = t.edge_id where n.node_id = ? and t.turn = 2",
        [f"T001.{k}.1"],
    )
    return row


def fork_request(model: FakeModel, data: Path, run_id: str, k: int, state: dict) -> dict:
    """The first request OpenCode sends when the session of T001.<k>.1's last turn goes on (a fork)."""
    config = RunConfig(
        task="speedup", backend="opencode", backend_options={"model": "fake/scripted", "endpoint": model.base_url}
    )
    teacher = OpenCodeTeacher(config, data / "runs" / run_id)
    edge = f"T001.{k}.1/e9-1"
    try:
        teacher.run_turn(
            TurnRequest(
                tree_id="T001",
                edge_id=edge,
                parent_id=f"T001.{k}.1",
                turn=1,
                slot=9,
                attempt=1,
                start_state=state,
                fork=True,
                timeout_s=300,
                direction="maximize",
            ),
            threading.Event(),
        )
    finally:
        teacher.close()
    return next(q for q in model.requests if q["where"].get("edge") == edge and q["tools"])


def check_sample(sample: dict, model: FakeModel, session: str, placed, fork: dict, case: str) -> list[str]:
    """The differences between a sample and what the model received, what it answered, what OpenCode sends on."""
    problems = []
    requests = [q for q in model.requests if q["session"] == session and q["tools"]]
    last = requests[-1]
    received = placed(last["messages"])
    n = len(received)
    if sample["messages"][:n] != received:
        problems.append(f"{case}: the sample is not the last request's messages")
    if json.loads(sample["tools"]) != placed(last["tool_list"]):
        problems.append(f"{case}: the sample's tools are not the last request's")
    # Whatever follows the last request is exactly what the fork of the session sent on.
    sent_on = placed(fork["messages"])[:-1]  # less the fork's own prompt
    if sample["messages"] != sent_on:
        problems.append(
            f"{case}: the sample differs from what OpenCode sends when the session goes on:\n"
            f"  sample tail {json.dumps(sample['messages'][n - 1 :])[:1500]}\n"
            f"  fork tail   {json.dumps(sent_on[n - 1 :])[:1500]}"
        )
    return problems


def usage_of_steps(model: FakeModel, session: str) -> list[dict]:
    """The usage the server reported for each answered request of a session, in order."""
    return [q["usage"] for q in model.requests if q["session"] == session and q["tools"] and q["answered"] == 200]


def check_tokens(cat: Catalog, atif: dict, model: FakeModel, k: int, case: str) -> list[str]:
    """The ATIF metrics of the leaf's last turn and the turn's and node's tokens against the server's usage."""
    problems = []
    leaf = leaf_turn(cat, k)
    usages = usage_of_steps(model, leaf["session_id"])
    edge = f"T001.{k}/e1-1"
    steps = [
        s
        for s in atif["steps"]
        if s["source"] == "agent" and s.get("extra", {}).get("edge_id") == edge and s["extra"]["turn"] == 2
    ]
    metrics = [(s.get("metrics") or {}).get("prompt_tokens") for s in steps]
    want = [u["prompt_tokens"] for u in usages][: len(steps)]
    if metrics != want:
        problems.append(f"{case}: ATIF prompt tokens {metrics} != the server's {want}")
    completion = [(s.get("metrics") or {}).get("completion_tokens") for s in steps]
    if completion != [u["completion_tokens"] for u in usages][: len(steps)]:
        problems.append(f"{case}: ATIF completion tokens {completion} != the server's")
    if leaf["context_tokens"] != usages[-1]["total_tokens"] or leaf["tok"] != usages[-1]["total_tokens"]:
        problems.append(
            f"{case}: context_tokens {leaf['context_tokens']} / tok {leaf['tok']} != the server's "
            f"{usages[-1]['total_tokens']}"
        )
    return problems


def compare_run(model: FakeModel, data: Path, run_id: str, cases: dict[int, str]) -> tuple[list[str], dict]:
    placed = placer(data, run_id)
    cat = Catalog.for_log(EventLog(data, run_id))
    chat = {s["metadata"]["leaf_id"]: s for s in exported(data, run_id, "chat")}
    atif = {t["extra"]["leaf_id"]: t for t in exported(data, run_id, "atif")}
    assert set(chat) == {f"T001.{k}.1" for k in cases}, sorted(chat)
    problems, facts = [], {}
    for k, case in cases.items():
        leaf = leaf_turn(cat, k)
        sample = chat[f"T001.{k}.1"]
        fork = fork_request(
            model, data, run_id, k, json.loads(leaf["state"]) if isinstance(leaf["state"], str) else leaf["state"]
        )
        problems += check_sample(sample, model, leaf["session_id"], placed, fork, case)
        problems += check_tokens(cat, atif[f"T001.{k}.1"], model, k, case)
        facts[case] = {"sample": sample, "atif": atif[f"T001.{k}.1"], "leaf": leaf}
    text = (data.parent / f"{run_id}-atif").joinpath(f"{run_id}.atif.jsonl").read_text()
    if "/worktrees/" in text:
        problems.append("the ATIF file names a worktree")
    # Each leaf's attempt as a labelled attempt (kto): the same conversation, cut where the attempt began.
    labels = {r["metadata"]["attempt"]["edge_id"]: r for r in exported(data, run_id, "kto")}
    for k, case in cases.items():
        row, sample = labels.get(f"T001.{k}/e1-1"), chat[f"T001.{k}.1"]
        if row is None or [*row["prompt"], *row["completion"]] != sample["messages"]:
            problems.append(f"{case}: the kto row of T001.{k}/e1-1 is not the chat sample cut at its fork")
        elif any(row["metadata"][f] != sample["metadata"][f] for f in ("interrupted_calls", "invalid_calls")):
            problems.append(f"{case}: the kto row's interrupted or invalid calls differ from the chat sample's")
    return problems, facts


@pytest.mark.slow
@pytest.mark.parametrize("serve", [True, False], ids=["served", "process"])
def test_cut_turns_export_what_the_model_received_and_what_opencode_sends_on(
    tmp_path,
    roots,  # noqa: F811 - a fixture
    student,  # noqa: F811
    coral_on_path,  # noqa: F811
    serve,
):
    cases = {1: "stall-first-byte", 2: "stall-headers", 3: "hanging"}
    model, data = run_cases(tmp_path, roots, student, "cut", cases, timeout=120, serve=serve)
    try:
        problems, facts = compare_run(model, data, "cut", cases)
    finally:
        model.stop()
    assert problems == []
    for case in ("stall-first-byte", "stall-headers"):
        sample, leaf = facts[case]["sample"], facts[case]["leaf"]
        assert leaf["outcome"] == "timeout"
        # The two real results of the cut request, not invented interrupted ones.
        tools = [m for m in sample["messages"] if m["role"] == "tool"][-2:]
        assert [m["content"] != INTERRUPTED for m in tools] == [True, True], tools
        assert sample["metadata"]["interrupted_calls"] == []
    hanging = facts["hanging"]["sample"]["messages"]
    assert "finished-call" in hanging[-2]["content"]
    # A served turn is aborted: OpenCode finishes the hanging call with what it sends on; a killed
    # process leaves it running, and OpenCode sends the interrupted result when the session goes on.
    if serve:
        assert "User aborted the command" in hanging[-1]["content"]
        assert facts["hanging"]["sample"]["metadata"]["interrupted_calls"] == []
    else:
        assert hanging[-1]["content"] == INTERRUPTED
    assert facts["hanging"]["leaf"]["context_tokens"] > 0


@pytest.mark.slow
def test_killed_retried_and_invalid_calls_export_what_the_model_received(
    tmp_path,
    roots,  # noqa: F811 - a fixture
    student,  # noqa: F811
    coral_on_path,  # noqa: F811
):
    # kill -9 of the turn's own OpenCode: a process a turn (a served turn's is the server, whose
    # loss test_opencode_server.py covers).
    cases = {1: "kill-9", 2: "retry-500", 3: "unknown-tool"}
    model, data = run_cases(tmp_path, roots, student, "odd", cases, timeout=300, serve=False)
    try:
        problems, facts = compare_run(model, data, "odd", cases)
    finally:
        model.stop()
    assert problems == []
    killed = facts["kill-9"]["sample"]["messages"]
    assert "finished-call" in killed[-2]["content"] and killed[-1]["content"] == INTERRUPTED
    assert facts["kill-9"]["sample"]["metadata"]["interrupted_calls"] == [killed[-1]["tool_call_id"]]
    # The unknown tool's call, as OpenCode re-sent it, is marked, and --invalid-calls drop leaves it out.
    invalid = facts["unknown-tool"]["sample"]["metadata"]["invalid_calls"]
    assert len(invalid) == 1
    assert [facts[c]["sample"]["metadata"]["invalid_calls"] for c in ("kill-9", "retry-500")] == [[], []]
    kept = exported(data, "odd", "chat", "--invalid-calls", "drop")
    assert sorted(s["metadata"]["leaf_id"] for s in kept) == ["T001.1.1", "T001.2.1"]
    labelled = {r["metadata"]["attempt"]["edge_id"] for r in exported(data, "odd", "kto", "--invalid-calls", "drop")}
    assert "T001.3/e1-1" not in labelled and {"T001.1/e1-1", "T001.2/e1-1"} <= labelled
    # ATIF keeps the arguments' keys in the order the model wrote them.
    for case in cases.values():
        chat_calls = [c for m in facts[case]["sample"]["messages"] for c in m.get("tool_calls") or []]
        atif_calls = [c for s in facts[case]["atif"]["steps"] for c in s.get("tool_calls") or []]
        assert [list(json.loads(c["function"]["arguments"])) for c in chat_calls] == [
            list(c["arguments"]) for c in atif_calls
        ]
