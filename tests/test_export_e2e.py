"""The export of a real OpenCode run: what the model received in its last request, message for message.

Real opencode, real git, the scripted model server of tests/fake_model.py (which logs
every request), the stand-in coral of tests/fixtures/bin (a CORAL run per edge, --coral-dir). The requests pass through
the backend's recorder; the exported conversation of the path must be exactly the
last request of the path's last turn, then the model's answer to it, with every
worktree directory replaced by the workspace placeholder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_model import FakeModel
from test_opencode_e2e import coral_on_path, explore_opencode, roots, script, student  # noqa: F401 - fixtures

from cli import cli
from engine.catalog import Catalog
from engine.teachers.opencode.options import TURN1, TURN2
from ingest.log import EventLog


@pytest.mark.slow
def test_the_exported_conversation_is_what_the_model_received(tmp_path, roots, student, coral_on_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_MODEL_KEY", "secret-4242")
    model = FakeModel(script).start()
    config = tmp_path / "run.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 1\nmax_children = 1\nmax_depth = 2\n")
    data = tmp_path / "data"
    try:
        r = explore_opencode(
            data, roots, model, config, "oc", "--api-key-env", "FAKE_MODEL_KEY", "--coral-dir", str(student)
        )
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    out = tmp_path / "train"
    done = CliRunner().invoke(cli, ["--data", str(data), "export", "oc", "--out", str(out)])
    assert done.exit_code == 0, done.output
    (sample,) = [json.loads(line) for line in (out / "oc.chat.jsonl").read_text().splitlines()]
    assert sample["metadata"]["node_ids"] == ["T001", "T001.1", "T001.1.1"]

    # The path's last turn: turn 2 of the edge that made the leaf; its last request to the model.
    cat = Catalog.for_log(EventLog(data, "oc"))
    last = cat.query(
        "select t.session_id from turns as t join nodes as n on n.edge_id = t.edge_id "
        "where n.node_id = 'T001.1.1' and t.turn = 2"
    )[0]["session_id"]
    requests = [q for q in model.requests if q["session"] == last and q["tools"]]
    assert requests, "the path's last turn sent no request"
    worktrees = re.escape(str((data / "runs" / "oc" / "worktrees").resolve()))

    def placed(value):  # the placeholder, applied independently of the exporter
        return json.loads(re.sub(worktrees + r"/T001/[^/\"]+/wt", "/workspace", json.dumps(value)))

    received = placed(requests[-1]["messages"])
    answer = {"role": "assistant", "content": "Done with T001.1/e1-1 turn 2."}
    assert sample["messages"] == [*received, answer]
    assert json.loads(sample["tools"]) == placed(requests[-1]["tool_list"])
    # Both edges of the path, both turns each, the first edge's prompts once: the default prompts,
    # which name no attempt (the model server learnt each request's turn from the recorder's header).
    prompts = [m["content"] for m in sample["messages"] if m["role"] == "user"]
    fill = {"task": sample["metadata"]["task"], "eval_command": "coral eval -m"}
    assert prompts == [TURN1.format(**fill), TURN2.format(**fill)] * 2
    assert "[edge" not in (out / "oc.chat.jsonl").read_text()
    headed = [(q["where"]["edge"], q["where"]["turn"]) for q in model.requests if q["tools"]]
    assert {("T001/e1-2", 1), ("T001/e1-2", 2), ("T001.1/e1-1", 1), ("T001.1/e1-1", 2)} <= set(headed)
    text = (out / "oc.chat.jsonl").read_text()
    assert "/worktrees/" not in text and "/workspace/solution.py" in text
    # transformers renders the sample as loaded by a trainer, its tools parsed from JSON.
    from datasets import load_dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from engine.export.training import CHAT_TEMPLATE, EOS, PAD

    loaded = load_dataset(
        "json", data_files=str(out / "oc.chat.jsonl"), split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE()), eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )
    for row in loaded:
        rendered = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
        assert all((m["content"] or "") in rendered for m in sample["messages"] if isinstance(m["content"], str))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["lengths"][0]["chars"] > 20_000  # the system prompt and the tools (docs/TRAINING.md: max_length)
    # The forks record only what they add; the key reaches the endpoint and nothing recorded.
    bases = {
        (b["edge_id"], b["turn"]): b["base"]
        for b in cat.query("select edge_id, turn, base from stg_conversation_recorded")
    }
    assert bases[("T001/e1-2", 1)] == 0  # a fresh session
    assert all(bases[k] > 0 for k in (("T001/e1-2", 2), ("T001.1/e1-1", 1), ("T001.1/e1-1", 2))), bases
    assert {q["authorization"] for q in model.requests} == {"Bearer secret-4242"}
    for path in [*EventLog(data, "oc").log_dir.iterdir(), *out.iterdir()]:
        assert b"secret-4242" not in path.read_bytes(), path
    # A preference pair from the same run: the root's retried attempt beside its retry. Each side's
    # prompt + continuation is exactly what that attempt's model received last, then its answer.
    pairs = tmp_path / "pairs"
    done = CliRunner().invoke(cli, ["--data", str(data), "export", "oc", "--format", "dpo", "--out", str(pairs)])
    assert done.exit_code == 0, done.output
    (pair,) = [json.loads(line) for line in (pairs / "oc.dpo.jsonl").read_text().splitlines()]
    sides = {pair["metadata"][s]["edge_id"]: pair[s] for s in ("chosen", "rejected")}
    assert set(sides) == {"T001/e1-1", "T001/e1-2"} and pair["metadata"]["node_id"] == "T001"
    for edge_id, continuation in sides.items():
        turn, session = cat.query(
            "select turn, session_id from turns where edge_id = ? and session_id is not null "
            "order by turn desc limit 1",
            [edge_id],
        )[0].values()
        asked = [q for q in model.requests if q["session"] == session and q["tools"]][-1]
        answer = {"role": "assistant", "content": f"Done with {edge_id} turn {turn}."}
        assert [*pair["prompt"], *continuation] == [*placed(asked["messages"]), answer], edge_id
        assert json.loads(pair["tools"]) == placed(asked["tool_list"])
    # The two attempts received the same prompt, the turn's included: the pair's sides start with the model's answer.
    assert [m["role"] for m in pair["prompt"]] == ["system", "user"] and pair["metadata"]["shared_prompt"] is True
    assert pair["prompt"][-1]["content"] == TURN1.format(**fill)
    assert pair["chosen"][0]["role"] == pair["rejected"][0]["role"] == "assistant"
    # Parallel calls are recorded in the order the model made them (the note first).
    calls = cat.query("select tool, target from tool_calls where edge_id = 'T001.1/e1-1' and turn = 2 order by seq")
    assert [Path(c["target"]).name for c in calls[:2]] == ["tiling.md", "does_not_exist.txt"]


def sleepy(edge: str, turn: int, step: int, workdir: str):
    """Turn 1 runs a command that outlives the turn's deadline; turn 2 reads and answers."""
    if turn == 1:
        return [("bash", {"command": "sleep 600"})] if step == 0 else "unreachable"
    return [("read", {"filePath": f"{workdir}/solution.py"})] if step == 0 else "Done."


@pytest.mark.slow
@pytest.mark.parametrize("serve", [True, False], ids=["served", "process"])
def test_a_turn_killed_in_the_middle_of_a_tool_call_keeps_the_call(tmp_path, roots, coral_on_path, serve):  # noqa: F811
    """A turn cut in the middle of a tool call: what its continuation sends the model is recorded,
    and the next turn's request begins with exactly that. A served turn is aborted, and OpenCode
    finishes the call with ``User aborted the command``; a killed ``opencode run`` prints a call
    only when it finishes, so the recorder keeps it, and OpenCode sends the model
    ``[Tool execution was interrupted]`` when the session goes on."""
    import threading

    from engine.config import RunConfig
    from engine.teachers import RootInfo, TurnRequest
    from engine.teachers.opencode import OpenCodeTeacher
    from ingest.events import ConversationRecorded, StepFinished, ToolCalled, TurnFinished

    model = FakeModel(sleepy).start()
    config = RunConfig(
        task="speedup",
        backend="opencode",
        backend_options={"model": "fake/scripted", "endpoint": model.base_url, "serve": serve},
    )
    teacher = OpenCodeTeacher(config, tmp_path / "run")
    try:
        folder = next(roots.iterdir())
        start = teacher.root_state(RootInfo("T001", str(folder), 1.0, None))
        ids = {
            "tree_id": "T001",
            "edge_id": "T001/e1-1",
            "parent_id": "T001",
            "slot": 1,
            "attempt": 1,
            "direction": "maximize",
        }
        # The deadline leaves OpenCode time to start and call bash on a loaded machine; sleep 600 outlives it.
        first = teacher.run_turn(
            TurnRequest(**ids, turn=1, start_state=start, fork=True, timeout_s=45), threading.Event()
        )
        state = first[-1].state
        second = teacher.run_turn(
            TurnRequest(**ids, turn=2, start_state=state, fork=False, timeout_s=300), threading.Event()
        )
    finally:
        teacher.close()
        model.stop()
    assert isinstance(first[-1], TurnFinished) and first[-1].outcome == "timeout"
    calls = [(f.tool, f.target) for f in first if isinstance(f, ToolCalled)]
    assert calls == ([("bash", "sleep 600")] if serve else [])  # aborted and finished, or never printed
    (killed,) = [f for f in first if isinstance(f, ConversationRecorded)]
    assert killed.model_calls == 1 and killed.base == 0
    # After the answer, the result OpenCode sends the model when the session goes on.
    assert [m["role"] for m in killed.messages] == ["user", "assistant", "tool"]
    call = killed.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "bash", "arguments": '{"command":"sleep 600"}'}
    result = "User aborted the command" if serve else "[Tool execution was interrupted]"
    assert killed.messages[2]["tool_call_id"] == call["id"] and result in killed.messages[2]["content"]
    (fork,) = [f for f in second if isinstance(f, ConversationRecorded)]
    assert fork.base == 3  # turn 1's conversation, its continuation included, as the fork received it
    assert fork.turn_start == 3 and fork.messages[0]["role"] == "user"
    assert fork.messages[-1] == {"role": "assistant", "content": "Done."}
    # The endpoint's tokens of the killed call stand in for those the stream never printed.
    (step,) = [f for f in first if isinstance(f, StepFinished)]
    usage = next(q["usage"] for q in model.requests if q["where"].get("turn") == 1 and q["tools"])
    assert (step.step, step.tokens_input, step.tokens_output) == (1, usage["prompt_tokens"], usage["completion_tokens"])
    assert first[-1].context_tokens == usage["total_tokens"]
