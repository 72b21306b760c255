"""export: golden files of a hand-built run, the chat export in Hugging Face datasets, determinism, refusals.

The golden files in tests/golden/ were written by this exporter and read line by line
(``UPDATE_GOLDEN=1`` rewrites them); besides the bytes, each test asserts what the
files must show.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hand_run
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_run

from cli import cli

GOLDEN = ROOT / "tests" / "golden"


def export(data: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["--data", str(data), "export", *args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("hand") / "data"
    hand_run.write(data)
    return data


def samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_golden(produced: Path, name: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_bytes(produced.read_bytes())
    assert produced.read_bytes() == golden.read_bytes(), f"{name} differs from the golden file"


def test_chat_golden_file_of_the_hand_built_run(hand, tmp_path):
    code, out, err = export(hand, "hand", "--out", str(tmp_path / "chat"))
    assert code == 0, err
    assert "2 chat samples (speedup late 2)" in out
    check_golden(tmp_path / "chat" / "hand.chat.jsonl", "hand.chat.jsonl")
    deep, shallow = samples(tmp_path / "chat" / "hand.chat.jsonl")
    messages = deep["messages"]
    roles = [m["role"] for m in messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    # The forked sessions' inherited prefix (edge T1/e1-1's two turns) appears once.
    prompts = [m["content"] for m in messages if m["role"] == "user"]
    assert prompts == [
        "Improve the solution [edge T1/e1-1 turn 1]",
        "Improve it further [edge T1/e1-1 turn 2]",
        "Next [edge T1.1/e1-1 turn 1]",
        "Again [edge T1.1/e1-1 turn 2]",
    ]
    # Parallel calls in the order the model made them (they finished the other way round).
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert [m["tool_call_id"] for m in messages[3:5]] == ["c1", "c2"]
    assert messages[4]["content"] == "File not found: /workspace/missing.py"  # the tool error, as the model saw it
    # The turn killed in the middle of its bash call keeps the call and OpenCode's result.
    assert messages[12]["tool_calls"][0]["function"]["arguments"] == '{"command": "sleep 600"}'
    assert messages[13] == {"role": "tool", "tool_call_id": "c4", "content": "[Tool execution was interrupted]"}
    assert messages[2]["reasoning_content"] == "Read the note first."
    # A path whose last turn was killed mid-call ends with that call, answered as OpenCode would.
    assert shallow["messages"][-1]["content"] == "[Tool execution was interrupted]"
    assert shallow["metadata"]["interrupted_calls"] == ["c6"]
    text = json.dumps([deep, shallow])
    assert "/runs/hand/worktrees" not in text and "/workspace/solution.py" in text
    meta = deep["metadata"]
    assert (meta["run_id"], meta["task"], meta["stage"], meta["snapshot"]) == (
        "hand",
        "speedup",
        "late",
        "eval-000001-agent-1-abc",
    )
    assert meta["node_ids"] == ["T1", "T1.1", "T1.1.1"] and meta["rank"] == 1
    assert [(n["node_id"], n["score"]) for n in meta["nodes"]] == [("T1", 1.0), ("T1.1", 1.3), ("T1.1.1", 1.5)]
    assert [(t["edge_id"], t["turn"], t["score"], t["outcome"]) for t in meta["turns"]] == [
        ("T1/e1-1", 1, 1.2, "completed"),
        ("T1/e1-1", 2, 1.3, "completed"),
        ("T1.1/e1-1", 1, None, "timeout"),
        ("T1.1/e1-1", 2, 1.5, "completed"),
    ]
    # The killed turn printed no step, but it asked the model once: one step (its model call).
    assert [t["steps"] for t in meta["turns"]] == [2, 2, 1, 2]
    tools = json.loads(deep["tools"])
    assert [t["function"]["name"] for t in tools] == ["bash", "read", "write"]
    manifest = json.loads((tmp_path / "chat" / "manifest.json").read_text())
    assert manifest["runs"][0]["selection_id"] == meta["selection_id"]
    assert manifest["counts"] == {"speedup": {"late": 2}}


def test_atif_golden_file_of_the_hand_built_run(hand, tmp_path):
    code, _, err = export(hand, "hand", "--format", "atif", "--out", str(tmp_path / "atif"))
    assert code == 0, err
    check_golden(tmp_path / "atif" / "hand.atif.jsonl", "hand.atif.jsonl")
    deep, shallow = samples(tmp_path / "atif" / "hand.atif.jsonl")
    for trajectory in (deep, shallow):
        assert_valid_atif(trajectory)
    steps = deep["steps"]
    assert [s["source"] for s in steps] == [
        "system",
        "user",
        "agent",
        "agent",
        "user",
        "agent",
        "agent",
        "user",
        "agent",
        "user",
        "agent",
        "agent",
    ]
    first = steps[2]
    assert [c["tool_call_id"] for c in first["tool_calls"]] == ["c1", "c2"]
    assert first["tool_calls"][0]["arguments"] == {"filePath": "/workspace/.opencode/notes/tiling.md"}
    assert [r["source_call_id"] for r in first["observation"]["results"]] == ["c1", "c2"]
    # The tool error names the worktree as the call's result does: both get the placeholder.
    assert first["extra"]["tool_errors"] == [
        {"tool_call_id": "c2", "function_name": "read", "error": "File not found: /workspace/missing.py"}
    ]
    assert first["observation"]["results"][1]["content"] == "File not found: /workspace/missing.py"
    # The arguments keep the model's key order (filePath, content, alpha), not a sorted one.
    write = steps[5]["tool_calls"][0]
    assert list(write["arguments"]) == ["filePath", "content", "alpha"]
    assert first["metrics"] == {"prompt_tokens": 1200, "completion_tokens": 55, "cached_tokens": 200, "cost_usd": 0.001}
    assert first["reasoning_content"] == "Read the note first."
    assert steps[3]["extra"]["eval"] == {"score": 1.2, "eval_status": "improved", "outcome": "completed"}
    killed = steps[8]  # turn 1 of T1.1/e1-1: its one model call, killed while its bash call ran
    assert killed["observation"]["results"] == [{"source_call_id": "c4", "content": "[Tool execution was interrupted]"}]
    assert killed["extra"]["eval"]["outcome"] == "timeout"
    # Its tokens: the step the stream never printed, from the endpoint's usage.
    assert killed["metrics"] == first["metrics"]  # the hand run's first call of a turn: 1200 + 55 tokens
    assert deep["final_metrics"]["total_steps"] == len(steps) and deep["extra"]["leaf_id"] == "T1.1.1"


def assert_valid_atif(t: dict) -> None:
    """The ATIF v1.4 rules a validator checks (an independent reading of the format)."""
    assert t["schema_version"] == "ATIF-v1.4" and t["session_id"] and t["agent"]["name"] and t["agent"]["version"]
    assert [s["step_id"] for s in t["steps"]] == list(range(1, len(t["steps"]) + 1))
    for s in t["steps"]:
        assert s["source"] in ("system", "user", "agent") and isinstance(s["message"], str)
        if s["source"] == "user":
            assert not {"model_name", "reasoning_content", "tool_calls", "metrics"} & set(s)
        ids = {c["tool_call_id"] for c in s.get("tool_calls", [])}
        for c in s.get("tool_calls", []):
            assert isinstance(c["arguments"], dict) and c["function_name"]
        for r in (s.get("observation") or {}).get("results", []):
            assert r["source_call_id"] in ids
    assert set(t["final_metrics"]) == {
        "total_prompt_tokens",
        "total_completion_tokens",
        "total_cached_tokens",
        "total_cost_usd",
        "total_steps",
    }


def test_no_reasoning_and_another_workspace(hand, tmp_path):
    code, _, err = export(hand, "hand", "--no-reasoning", "--workspace", "/src/app", "--out", str(tmp_path / "o"))
    assert code == 0, err
    text = (tmp_path / "o" / "hand.chat.jsonl").read_text()
    assert "reasoning_content" not in text and "/src/app/missing.py" in text and "/workspace" not in text


def test_the_chat_export_loads_with_datasets(hand, runs, tmp_path):
    """What a trainer does: load_dataset("json"), then read roles, tool call ids and tools."""
    from datasets import load_dataset

    for data, run in ((hand, "hand"), (runs, "rounds")):
        out = tmp_path / run
        code, _, err = export(data, run, "--out", str(out))
        assert code == 0, err
        dataset = load_dataset(
            "json", data_files=str(out / f"{run}.chat.jsonl"), split="train", cache_dir=str(tmp_path / "hf-cache")
        )
        manifest = json.loads((out / "manifest.json").read_text())
        assert len(dataset) == manifest["samples"] > 0
        for row in dataset:
            messages = row["messages"]
            assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
            assert {m["role"] for m in messages} <= {"system", "user", "assistant", "tool"}
            called: set[str] = set()
            for m in messages:
                if m["role"] == "assistant":
                    for c in m.get("tool_calls") or []:
                        assert c["type"] == "function" and isinstance(json.loads(c["function"]["arguments"]), dict)
                        called.add(c["id"])
                if m["role"] == "tool":
                    assert m["tool_call_id"] in called, "a tool message answers no earlier call"
            for definition in json.loads(row["tools"]):
                function = definition["function"]
                assert definition["type"] == "function" and isinstance(function["name"], str)
                assert function["parameters"]["type"] == "object"
                assert isinstance(function["parameters"]["properties"], dict)
            assert row["metadata"]["run_id"] == run and row["metadata"]["node_ids"][0] == row["metadata"]["tree_id"]


@pytest.mark.slow
def test_reexport_is_byte_identical_and_a_reselection_is_another_set(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    files = {}
    for name in ("a", "b"):
        code, _, err = export(data, "rounds", "--out", str(tmp_path / name))
        assert code == 0, err
        files[name] = {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()}
    assert files["a"] == files["b"]
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(data),
            "reselect",
            "rounds",
            "--weights",
            "max=1,avg=0,clean=0,know=0",
            "--top-k",
            "2",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    other = json.loads(r.stdout)["selection_id"]
    code, _, err = export(data, "rounds", "--selection", other, "--out", str(tmp_path / "c"))
    assert code == 0, err
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["runs"][0]["selection_id"] == other
    default = json.loads(files["a"]["manifest.json"])
    assert manifest["files"]["rounds.chat.jsonl"]["sha256"] != default["files"]["rounds.chat.jsonl"]["sha256"]
    chosen = samples(tmp_path / "c" / "rounds.chat.jsonl")
    leaves = {(s["metadata"]["tree_id"], s["metadata"]["leaf_id"]) for s in chosen}
    assert len(leaves) == manifest["samples"] < default["samples"]


@pytest.mark.slow
def test_export_refuses_what_it_cannot_do_and_writes_nothing(hand, tmp_path):
    data = tmp_path / "data"
    hand_run.write(data, "unselected", select=False)
    hand_run.write(data, "old", drop={"T1.1/e1-1#2"})
    out = tmp_path / "out"
    code, _, err = export(data, "unselected", "--out", str(out))
    assert code == 1 and err == "Error: run 'unselected' has no path selection yet (is it still running?)\n"
    code, _, err = export(data, "old", "--out", str(out))
    assert code == 1 and "turn 2 of edge T1.1/e1-1" in err and "no recorded conversation" in err
    code, _, err = export(data, "old", "--selection", "paths-000000000000", "--out", str(out))
    assert code == 1 and "has no selection 'paths-000000000000'" in err
    code, _, err = export(hand, "hand", "--task", "other", "--out", str(out))
    assert code == 1 and err == "Error: no selected path of task 'other' in hand\n"
    code, _, err = export(data, "nosuch", "--out", str(out))
    assert code == 1 and "run 'nosuch' not found" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = export(hand, "hand", "--out", str(out), "--overwrite")
    assert code == 1 and "not empty and not an earlier export" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert "Traceback" not in err


def test_export_of_several_runs_and_an_earlier_export_replaced(hand, runs, tmp_path):
    data = tmp_path / "data"
    copy_run(hand, "hand", data)
    copy_run(runs, "rounds", data)
    out = tmp_path / "out"
    code, stdout, err = export(data, "--out", str(out), "--json")  # no RUN_ID: every run with a selection
    assert code == 0, err
    manifest = json.loads(stdout)
    assert [r["run_id"] for r in manifest["runs"]] == ["hand", "rounds"]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "hand.chat.jsonl", "manifest.json", "rounds.chat.jsonl"]
    code, _, err = export(data, "hand", "--out", str(out), "--overwrite", "--format", "atif")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "hand.atif.jsonl", "manifest.json"]
    on_disk = json.loads((out / "manifest.json").read_text())
    import hashlib

    digest = hashlib.sha256((out / "hand.atif.jsonl").read_bytes()).hexdigest()
    assert on_disk["files"]["hand.atif.jsonl"]["sha256"] == digest


def test_the_manifest_gives_each_samples_length(hand, tmp_path):
    """A trainer's max_length must hold a sample: the manifest says how long each one is."""
    out = tmp_path / "chat"
    code, stdout, err = export(hand, "hand", "--out", str(out))
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    rows = samples(out / "hand.chat.jsonl")
    assert [(r["file"], r["leaf_id"]) for r in manifest["lengths"]] == [
        ("hand.chat.jsonl", s["metadata"]["leaf_id"]) for s in rows
    ]
    for row, sample in zip(manifest["lengths"], rows, strict=True):
        texts = (
            [m.get("content") or "" for m in sample["messages"]]
            + [m.get("reasoning_content") or "" for m in sample["messages"]]
            + [
                c["function"]["name"] + c["function"]["arguments"]
                for m in sample["messages"]
                for c in m.get("tool_calls") or []
            ]
            + [sample["tools"]]
        )
        assert row["chars"] == sum(map(len, texts))
    assert manifest["max_chars"] == max(r["chars"] for r in manifest["lengths"]) and manifest["tokenizer"] is None
    assert f"longest sample: {manifest['max_chars']} characters" in stdout


def test_a_call_of_a_tool_not_offered_is_marked():
    from engine.export.conversations import PathConversation, invalid_calls

    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in (("a", "read"), ("b", "invalid"))
    ]
    conv = PathConversation([], tools, [{"role": "assistant", "content": "", "tool_calls": calls}], [None])
    assert invalid_calls(conv) == ["b"]
