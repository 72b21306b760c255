"""Campaigns: many tasks, one budget (engine.campaign), driven through the real CLI in subprocesses
(their views read in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.catalog import Catalog
from engine.runset import open_campaign
from ingest.events import BudgetAllocated, CampaignTaskAdded, RunStarted
from ingest.log import EventLog, LogWriter

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
EXPLORE = {"backend": "sim", "parallel": 3, "selection": {"num_roots": 3}, "tree": {"max_valid_edges": 10}}
TASKS = [("easy", 0.0, 1), ("hard", 0.9, 2), ("mixed", 0.4, 3)]  # name, hard_share, seed


def cli(data: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
    )
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def campaign_file(tmp: Path, policy: str, budget: dict[str, int] | None = None, name: str = "camp") -> Path:
    lines = [f'policy = "{policy}"', "parallel = 4"]
    if budget:
        lines += ["[budget]"] + [f"{k} = {v}" for k, v in budget.items()]
        lines += ["[coverage]", "first_pass_edges = 3", "block_edges = 3", "blocks_per_round = 3"]
    lines += ["[explore]"] + [f"{k} = {toml_value(v)}" for k, v in EXPLORE.items()]
    for task, hard, seed in TASKS:
        lines += [
            "[[tasks]]",
            f'name = "{task}"',
            f'source = "{SNAPSHOTS}"',
            f"backend_options = {{ hard_share = {hard} }}",
            f"explore = {{ seed = {seed} }}",
        ]
    path = tmp / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(data: Path, run: str, sql: str) -> list[dict]:
    """A query's rows, read in this process (what a read prints is not what these tests are about)."""
    from click.testing import CliRunner

    from cli import cli as command_line

    done = CliRunner().invoke(command_line, ["--data", str(data), "sql", run, sql, "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


BUDGET = {"edges": 40}


@pytest.fixture(scope="module")
def coverage(tmp_path_factory) -> tuple[Path, dict]:
    """A coverage campaign ``camp`` of the three tasks on 40 edges, and what it printed (--json).

    Tests only read it; one that changes its data works on a copy (``copied``)."""
    base = tmp_path_factory.mktemp("coverage")
    data = base / "data"
    # (named by --name, not by its file's name)
    done = cli(data, "campaign", str(campaign_file(base, "coverage", BUDGET, name="cov")), "--name", "camp", "--json")
    return data, json.loads(done.stdout)


def copied(coverage: tuple[Path, dict], tmp: Path) -> Path:
    import shutil

    data = tmp / "data"
    shutil.copytree(coverage[0], data)
    return data


EDGES = "select tree_id, edge_id, verdict, child_id from edges order by edge_id"
PATHS = "select tree_id, leaf_id, round(path_score, 9) as score from paths where selected order by tree_id, leaf_id"
DECISIONS = (
    "select kind, tree_id, edge_id, node_id, verdict, reason from events "
    "where kind in ('edge_judged', 'node_selected', 'tree_stopped', 'turn_skipped') order by seq"
)


@pytest.mark.slow
def test_a_fixed_campaign_grows_every_run_as_a_separate_explore_does(tmp_path):
    data = tmp_path / "data"
    done = cli(data, "campaign", str(campaign_file(tmp_path, "fixed")), "--json")
    result = json.loads(done.stdout)
    assert result["runs"] == [f"camp-{t}" for t, _, _ in TASKS]
    assert result["stop_reason"] == "trees_stopped"
    for task, hard, seed in TASKS:
        config = tmp_path / f"{task}.toml"
        config.write_text(
            "\n".join([*(f"{k} = {toml_value(v)}" for k, v in EXPLORE.items()), f"seed = {seed}"])
            + f"\n[backend_options]\nhard_share = {hard}\n"
        )
        alone = f"alone-{task}"
        cli(data, "explore", str(SNAPSHOTS), "--select", "--task", task, "--config", str(config), "--run-id", alone)
        for sql in (EDGES, PATHS, DECISIONS):
            assert rows(data, f"camp-{task}", sql) == rows(data, alone, sql), (task, sql)
        assert len(rows(data, alone, EDGES)) > 10


@pytest.mark.slow
def test_a_coverage_campaign_spends_its_budget_and_replays_with_no_difference(tmp_path, coverage):
    data, result = coverage
    assert result["stop_reason"] == "budget_spent"
    assert result["total"]["kept_edges"] == BUDGET["edges"]  # the last block takes the edges left
    assert result["total"]["n_eff"] > 0 and 0 < result["total"]["n_eff_ratio"] <= 1
    catalog = open_campaign(data, "camp")
    grants = catalog.query("select * from campaign_grants")
    first = [g for g in grants if g["rule"] == "first_pass"]
    assert len(first) == 9 and {g["edges"] for g in first} == {3}  # every root of every task
    later = [g for g in grants if g["rule"] == "coverage"]
    assert later and all(g["gain"] is not None for g in later)
    for run in result["runs"]:
        trees = rows(data, run, "select tree_id, status, stop_reason, kept_edges from trees")
        granted = {
            r["tree_id"]: r["edges"]
            for r in rows(data, run, "select tree_id, sum(edges) as edges from stg_block_granted group by 1")
        }
        assert all(t["status"] == "done" and t["stop_reason"] for t in trees)
        assert all(t["kept_edges"] <= granted[t["tree_id"]] for t in trees)  # no tree outgrew its grants
    replayed = cli(data, "replay", "camp", "--json")
    document = json.loads(replayed.stdout)
    assert document["differ"] == 0 and document["decisions"] > len(grants)
    assert len(document["runs"]) == 3
    # the campaign's name stands for its runs
    audited = json.loads(cli(data, "audit", "camp", "--json", check=False).stdout)
    assert sorted(audited["runs"]) == sorted(result["runs"])
    cli(data, "export", "camp", "--out", str(tmp_path / "train"))
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert sorted(r["run_id"] for r in manifest["runs"]) == sorted(result["runs"])
    assert manifest["samples"] == result["total"]["n"]  # a sample per selected path
    cli(data, "report", "camp", "--out", str(tmp_path / "report.html"))
    assert all(run in (tmp_path / "report.html").read_text() for run in result["runs"])


@pytest.mark.slow
def test_replay_names_a_round_the_runs_do_not_imply(tmp_path, coverage):
    data = copied(coverage, tmp_path)
    original = open_campaign(data, "camp")
    forged = "forged"
    with LogWriter.create(data / "campaigns", forged) as writer:
        events = []
        started = original.query("select config_json from campaign_config")[0]["config_json"]
        events.append(RunStarted(command="campaign", config=json.loads(started)))
        for t in original.query("select * from campaign_tasks order by task_order"):
            events.append(CampaignTaskAdded(task=t["task"], task_run=t["task_run"], source=t["source"]))
        for r in original.query("select * from campaign_rounds where rule <> 'stop' order by seq"):
            grants = json.loads(r["grants"])
            if r["round"] == 1:  # the round's first block goes to another tree than the policy chose
                grants[0] = grants[0] | {"tree_id": "T003" if grants[0]["tree_id"] != "T003" else "T001"}
            events.append(
                BudgetAllocated(
                    watermark=0, round=r["round"], rule=r["rule"], marks=json.loads(r["marks"]), grants=grants
                )
            )
        writer.stage(events)
        writer.flush()
    done = cli(data, "replay", forged, check=False)
    assert done.returncode == 1, done.stdout
    assert "budget_allocated round 1: grants differ" in done.stdout
    assert "the run's grants differ from the campaign's" in done.stdout  # the runs hold the real round


@pytest.mark.slow
def test_a_campaign_killed_with_kill_9_resumes_to_the_same_campaign(tmp_path, coverage):
    budget = BUDGET
    whole, killed = coverage[0], tmp_path / "killed"
    kills = ["campaign.decided:2", "publish.renamed:6", "edge.started:4"]
    first = cli(
        killed,
        "campaign",
        str(campaign_file(tmp_path, "coverage", budget)),
        env={"TEACHER_MCTS_CRASH_AT": kills[0]},
        check=False,
    )
    assert first.returncode == -9, first.stderr
    for kill in kills[1:]:
        again = cli(killed, "campaign", "--resume", "camp", env={"TEACHER_MCTS_CRASH_AT": kill}, check=False)
        assert again.returncode == -9, again.stdout + again.stderr
    cli(killed, "campaign", "--resume", "camp")
    grants = (
        "select round, rule, task_run, tree_id, edges, round(gain, 9) as gain "
        "from campaign_grants order by round, task_run, tree_id"
    )
    assert open_campaign(killed, "camp").query(grants) == open_campaign(whole, "camp").query(grants)
    for task, _, _ in TASKS:
        for sql in (EDGES, PATHS, DECISIONS):
            assert rows(killed, f"camp-{task}", sql) == rows(whole, f"camp-{task}", sql), (task, sql)
    assert json.loads(cli(killed, "replay", "camp", "--json").stdout)["differ"] == 0
    resumed = Catalog.for_log(EventLog(killed / "campaigns", "camp"))
    assert resumed.query("select count(*) as n from events where kind = 'run_resumed'")[0]["n"] == 3


@pytest.mark.slow
def test_bad_campaign_files_are_refused_naming_the_file(tmp_path):
    data = tmp_path / "data"
    cases = {
        "no-budget.toml": ('policy = "coverage"\n[[tasks]]\nname = "a"\nsource = "x"\n', "needs a budget"),
        "fixed-budget.toml": (
            'policy = "fixed"\n[budget]\nedges = 10\n[[tasks]]\nname = "a"\nsource = "x"\n',
            "takes no [budget]",
        ),
        "twice.toml": (
            'policy = "fixed"\n[[tasks]]\nname = "a"\nsource = "x"\n[[tasks]]\nname = "a"\nsource = "y"\n',
            "tasks named more than once: a",
        ),
        "bad-name.toml": ('policy = "fixed"\n[[tasks]]\nname = "a b"\nsource = "x"\n', "task name 'a b'"),
        "bad-key.toml": (
            'policy = "fixed"\n[explore]\ntree = { max_valid_edges = 0 }\n[[tasks]]\nname = "a"\nsource = "x"\n',
            "task 'a': invalid explore configuration",
        ),
        "not-toml.toml": ("policy = \n", "invalid TOML"),
        "no-source.toml": ('policy = "fixed"\n[[tasks]]\nname = "a"\nsource = "missing"\n', "missing"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        done = cli(data, "campaign", str(tmp_path / name), check=False)
        assert done.returncode != 0 and message in done.stderr, (name, done.stderr)
        assert name in done.stderr or str(tmp_path / "missing") in done.stderr, (name, done.stderr)
        assert "Traceback" not in done.stderr
        assert not (data / "campaigns").exists() or not any((data / "campaigns").rglob("*.parquet"))
    missing = cli(data, "campaign", "--resume", "nothing", check=False)
    assert missing.returncode != 0 and "campaign 'nothing' not found" in missing.stderr


@pytest.mark.slow
def test_a_run_of_a_coverage_campaign_is_not_resumed_alone(tmp_path, coverage):
    data = copied(coverage, tmp_path)
    done = cli(data, "explore", "--resume", "camp-easy", check=False)
    assert done.returncode != 0 and "campaign --resume camp" in done.stderr


@pytest.mark.slow
def test_a_first_pass_of_one_root_a_task_opens_the_others_by_their_gain(tmp_path):
    data = tmp_path / "data"
    path = campaign_file(tmp_path, "coverage", {"edges": 30})
    path.write_text(path.read_text().replace("[coverage]\n", "[coverage]\nfirst_pass_roots = 1\n"))
    cli(data, "campaign", str(path))
    grants = open_campaign(data, "camp").query("select * from campaign_grants order by seq, task_run, tree_id")
    first = [(g["task"], g["tree_id"]) for g in grants if g["rule"] == "first_pass"]
    assert first == [("easy", "T001"), ("hard", "T001"), ("mixed", "T001")]  # the first of 3: index 0 * 3 // 1
    opened_later = {(g["task"], g["tree_id"]) for g in grants if g["rule"] == "coverage"} - set(first)
    assert opened_later  # a root the first pass left is opened by a block
    granted = (
        "select t.tree_id, t.kept_edges, t.stop_reason, coalesce(g.edges, 0) as granted from trees as t "
        "left join (select tree_id, sum(edges) as edges from stg_block_granted group by 1) as g using (tree_id)"
    )
    for task, _, _ in TASKS:
        for tree in rows(data, f"camp-{task}", granted):
            assert tree["kept_edges"] <= tree["granted"]
            assert tree["granted"] > 0 or tree["stop_reason"] == "budget"  # never opened: stopped by the budget
    assert json.loads(cli(data, "replay", "camp", "--json").stdout)["differ"] == 0


@pytest.mark.slow
def test_watch_follows_a_campaign_to_its_end(tmp_path):
    data = tmp_path / "data"
    path = campaign_file(tmp_path, "coverage", {"edges": 24})
    writer = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "campaign", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (data / "campaigns" / "runs" / "camp" / "log").exists():
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        watched = cli(data, "watch", "camp", "--period", "0.5")
    finally:
        writer.wait(600)
    assert writer.returncode == 0
    frames = watched.stdout.strip().split("campaign camp (coverage): ")[1:]
    assert frames and frames[-1].startswith("finished") and "stopped: budget_spent" in frames[-1]
    assert all(f"camp-{t} " in frames[-1] or f"(camp-{t})" in frames[-1] for t, _, _ in TASKS)


def test_a_campaigns_spend_agrees_everywhere_it_is_shown(coverage):
    """The campaign's spend, computed here from its runs' raw events, is what its result, the campaigns
    table and each round of its page (its runs read at the round's marks) show (issue 55)."""
    from test_one_rule import raw_kept_edges, raw_tokens_and_cost

    from engine.collection import Collection
    from engine.web.data import campaign_page, campaigns_table

    data, result = coverage
    runs = Collection(data, result["runs"])
    edges = sum(raw_kept_edges(data, run) for run in result["runs"])
    tokens = sum(raw_tokens_and_cost(data, run)[0] for run in result["runs"])
    assert (result["total"]["kept_edges"], result["total"]["tokens"]) == (edges, tokens)
    (row,) = campaigns_table(data, runs)[0]
    assert (row["spent_edges"], row["spent_tokens"]) == (edges, tokens)
    rounds = campaign_page(data, "camp", runs)["rounds"]
    assert rounds
    for r in rounds:
        marks = json.loads(r["marks"] or "{}")
        if not marks:
            continue
        want_edges = sum(raw_kept_edges(data, run, mark) for run, mark in marks.items())
        want_tokens = sum(raw_tokens_and_cost(data, run, mark)[0] for run, mark in marks.items())
        assert (r["spent_edges"], r["spent_tokens"]) == (want_edges, want_tokens), r["round"]
