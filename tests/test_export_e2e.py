"""The export of a real OpenCode run: what the model received in its last request, message for message.

Real opencode, real git, the scripted model server of tests/fake_model.py (which logs
every request), the stand-in coral of tests/fixtures/bin. The requests pass through
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
from test_opencode_e2e import coral_on_path, explore_opencode, roots, script  # noqa: F401 - fixtures

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog


@pytest.mark.slow
def test_the_exported_conversation_is_what_the_model_received(tmp_path, roots, coral_on_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_MODEL_KEY", "secret-4242")
    model = FakeModel(script).start()
    config = tmp_path / "run.toml"
    config.write_text("parallel = 1\n[tree]\nroot_children = 1\nmax_children = 1\nmax_depth = 2\n")
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "oc", "--api-key-env", "FAKE_MODEL_KEY")
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
    last = cat.query("select t.session_id from turns as t join nodes as n on n.edge_id = t.edge_id "
                     "where n.node_id = 'T001.1.1' and t.turn = 2")[0]["session_id"]  # fmt: skip
    requests = [q for q in model.requests if q["session"] == last and q["tools"]]
    assert requests, "the path's last turn sent no request"
    worktrees = re.escape(str((data / "runs" / "oc" / "worktrees").resolve()))

    def placed(value):  # the placeholder, applied independently of the exporter
        return json.loads(re.sub(worktrees + r"/T001/[^/\"]+/wt", "/workspace", json.dumps(value)))

    received = placed(requests[-1]["messages"])
    answer = {"role": "assistant", "content": "Done with T001.1/e1-1 turn 2."}
    assert sample["messages"] == [*received, answer]
    assert json.loads(sample["tools"]) == placed(requests[-1]["tool_list"])
    # Both edges of the path, both turns each, the first edge's prompts once.
    prompts = [m["content"] for m in sample["messages"] if m["role"] == "user"]
    assert [re.search(r"\[edge (\S+) turn (\d)\]", p).groups() for p in prompts] == [
        ("T001/e1-2", "1"), ("T001/e1-2", "2"), ("T001.1/e1-1", "1"), ("T001.1/e1-1", "2")]
    text = (out / "oc.chat.jsonl").read_text()
    assert "/worktrees/" not in text and "/workspace/solution.py" in text
    # The forks record only what they add; the key reaches the endpoint and nothing recorded.
    bases = {(b["edge_id"], b["turn"]): b["base"] for b in
             cat.query("select edge_id, turn, base from stg_conversation_recorded")}  # fmt: skip
    assert bases[("T001/e1-2", 1)] == 0  # a fresh session
    assert all(bases[k] > 0 for k in (("T001/e1-2", 2), ("T001.1/e1-1", 1), ("T001.1/e1-1", 2))), bases
    assert {q["authorization"] for q in model.requests} == {"Bearer secret-4242"}
    for path in [*EventLog(data, "oc").log_dir.iterdir(), *out.iterdir()]:
        assert b"secret-4242" not in path.read_bytes(), path
    # Parallel calls are recorded in the order the model made them (the note first).
    calls = cat.query("select tool, target from tool_calls where edge_id = 'T001.1/e1-1' and turn = 2 order by seq")
    assert [Path(c["target"]).name for c in calls[:2]] == ["tiling.md", "does_not_exist.txt"]
