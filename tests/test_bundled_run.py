"""The README main job on the bundled Student run: it completes, replays, and the sim
Teacher exercises every rule of ALGORITHM §2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog


@pytest.mark.slow
def test_the_main_job_exercises_every_rule_and_replays(bundled):
    data = bundled
    r = CliRunner().invoke(cli, ["--data", str(data), "explore", "--resume", "main", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["progress"]["trees"] == 30 and out["progress"]["trees_done"] == 30
    cat = Catalog.for_log(EventLog(data, "main"))

    def count(sql: str) -> int:
        return cat.query(f"select count(*) as n from ({sql})")[0]["n"]

    rules = {
        "layer-1 retry": "select * from edges where verdict = 'retry'",
        "kept after retry": "select * from edges where layer = 1 and attempt = 2 and verdict = 'kept'",
        "kept-exempt after retry": "select * from edges where layer = 1 and attempt = 2 and verdict = 'kept_exempt'",
        "layer-2 exemption": "select * from edges where layer = 2 and verdict = 'kept_exempt'",
        "pruned by eval": "select * from edges where verdict = 'pruned' and not eval_ok",
        "pruned by tool errors": "select * from edges where verdict = 'pruned' and eval_ok and tool_error_rate > 0.3",
        "turn 2 skipped": "select * from turns where skipped",
        "exhausted node": "select * from nodes where leaf_reason = 'exhausted'",
        "token leaf at depth 2": "select * from nodes where leaf_reason = 'token' and depth = 2",
        "token leaf at depth 4": "select * from nodes where leaf_reason = 'token' and depth = 4",
        "depth leaf": "select * from nodes where leaf_reason = 'depth'",
        "stopped leaf": "select * from nodes where leaf_reason = 'stopped'",
        "stop on good leaves": "select * from trees where stop_reason = 'good_leaves'",
        "stop when exhausted": "select * from trees where stop_reason = 'exhausted'",
        "knowledge in both turns": "select * from edges where has_knowledge",
        "unranked path": "select * from paths where not ranked",
    }
    missing = [name for name, sql in rules.items() if count(sql) == 0]
    assert missing == []
    rates = cat.query("select count(*) filter (where s1 is null) * 1.0 / count(*) as null_rate from edges")[0]
    assert 0.05 < rates["null_rate"] < 0.3
    assert count("select * from top_paths") == sum(min(6, t["ranked"]) for t in out["trees"])
    replay = CliRunner().invoke(cli, ["--data", str(data), "replay", "main"])
    assert replay.exit_code == 0 and replay.stdout.rstrip().endswith(" 0 differ")


@pytest.mark.slow
def test_audit_of_the_bundled_run_prints_every_table_and_exits_0(bundled):
    r = CliRunner().invoke(cli, ["--data", str(bundled), "audit", "main", "--by", "task,stage,depth,lineage"])
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().endswith("audit: no violations")
    out = json.loads(CliRunner().invoke(cli, ["--data", str(bundled), "audit", "--json"]).stdout)
    everything = next(row for row in out["coverage"] if row["stratum"] == "all")
    assert everything["selected_paths"] == 178 and 0.3 < everything["n_eff_ratio"] < 1
    assert {row["stratum_key"] for row in out["coverage"] if row["stratum"] == "stage"} == {"early", "middle", "late"}


@pytest.mark.slow
def test_the_main_job_exports_one_sample_per_selected_path(bundled, tmp_path):
    r = CliRunner().invoke(cli, ["--data", str(bundled), "export", "main", "--out", str(tmp_path / "train"), "--json"])
    assert r.exit_code == 0, r.output
    manifest = json.loads(r.stdout)
    top = Catalog.for_log(EventLog(bundled, "main")).query("select count(*) as n from top_paths")[0]["n"]
    assert manifest["samples"] == top > 100
    assert sum(n for stages in manifest["counts"].values() for n in stages.values()) == top
