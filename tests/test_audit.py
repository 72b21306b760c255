"""Audits (ALGORITHM §5): N_eff on hand-computed cases, stratified coverage, a collection of
runs, the read-only `sql` command, `audit`, the notebook API and lineage-aware reselection."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import copy_run
from facts import edge, fanout, root

from cli import cli
from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from engine.collection import open_runs
from engine.config import RunConfig, TreeConfig
from ingest.events import RootAdded, RunStarted, TreeStopped
from ingest.log import EventLog, LogWriter
from ingest.schema import to_arrow


def neff_reference(paths: dict[str, list[str]]) -> float:
    """N_eff of a set of paths (each a list of edge ids) in plain Python: sum of 1/(m_e L_p)."""
    through: dict[str, int] = defaultdict(int)
    for edges in paths.values():
        for e in edges:
            through[e] += 1
    return sum(1 / (through[e] * len(edges)) for edges in paths.values() for e in edges)


def coverage(cat: Catalog, stratum: str) -> dict[str, dict]:
    return {r["stratum_key"]: r for r in cat.query("select * from coverage where stratum = ?", [stratum])}


def shared_first_edge(*extra) -> tuple[list, RunConfig]:
    """T1 -> T1.1 -> T1.1.1, T1.1.2, T1.1.3: three paths of length 2 sharing their first edge."""
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_children=3, max_depth=2))
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6)]
    for slot, score in ((1, 1.9), (2, 1.8), (3, 1.7)):
        events += edge(f"T1.1/e{slot}-1", "T1.1", score, score)
    for e in extra:
        events += e
    return events, config


def catalog_from(events, config) -> Catalog:
    from conftest import catalog_of

    return catalog_of(events, config)


def test_n_eff_of_three_paths_sharing_their_first_edge_and_of_a_root_without_paths():
    # T2: one kept direction, still open (no leaf, so no candidate path at all).
    events, config = shared_first_edge([root("T2"), *edge("T2/e1-1", "T2", 1.1, 1.2)])
    cat = catalog_from(events, config)
    everything = coverage(cat, "all")["all"]
    # Edge a is on all three paths (m = 3), each of length 2: 3 x 1/(3*2) + 3 x 1/2 = 2.
    assert (everything["selected_paths"], everything["n_eff"]) == (3, pytest.approx(2.0))
    assert everything["n_eff_ratio"] == pytest.approx(2 / 3)
    roots = coverage(cat, "root")
    assert roots["T2"]["selected_paths"] == 0 and roots["T2"]["n_eff"] is None and roots["T2"]["n_eff_ratio"] is None
    assert roots["T1"]["n_eff"] == pytest.approx(2.0)
    # The curve adds the paths by PathScore: 1, then 1.5 (a shared by two), then 2.
    curve = cat.query("select n, n_eff from coverage_curve where scope = 'root' and tree_id = 'T1' order by n")
    assert [(r["n"], r["n_eff"]) for r in curve] == [(1, 1.0), (2, pytest.approx(1.5)), (3, pytest.approx(2.0))]
    pooled = cat.query("select n, n_eff from coverage_curve where scope = 'pooled' order by n")
    assert [r["n_eff"] for r in pooled] == pytest.approx([1.0, 1.5, 2.0])


def test_n_eff_of_paths_of_different_lengths_and_recomputed_inside_a_depth_stratum():
    """p1 = (a, b) of length 2 ends in a token leaf; p2 = (a, c, d) of length 3 at max depth."""
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_depth=3, hard_token_limit=50_000))
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6)]
    events += edge("T1.1/e1-1", "T1.1", 1.7, 1.8, tokens=60_000)  # T1.1.1: a token leaf
    events += edge("T1.1/e2-1", "T1.1", 1.6, 1.7)  # T1.1.2
    events += edge("T1.1.2/e1-1", "T1.1.2", 1.9, 2.0)  # T1.1.2.1: a depth leaf
    cat = catalog_from(events, config)
    # a: (1/2)(1/2 + 1/3); b: 1/2; c, d: 1/3 each = 19/12.
    assert coverage(cat, "all")["all"]["n_eff"] == pytest.approx(19 / 12)
    assert neff_reference({"p1": ["a", "b"], "p2": ["a", "c", "d"]}) == pytest.approx(19 / 12)
    depth = coverage(cat, "depth")
    # Inside a depth stratum each path is alone: m_e = 1, so N_eff = 1 each.
    assert (depth["2"]["selected_paths"], depth["2"]["n_eff"]) == (1, pytest.approx(1.0))
    assert (depth["3"]["selected_paths"], depth["3"]["n_eff"]) == (1, pytest.approx(1.0))
    assert depth["2"]["kept_edges"] == 2 and depth["3"]["kept_edges"] == 1  # the edges at that layer


def test_n_eff_of_a_single_path_is_one():
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_depth=1))
    cat = catalog_from([root(), *edge("T1/e1-1", "T1", 1.5, 1.6)], config)
    row = coverage(cat, "all")["all"]
    assert (row["selected_paths"], row["n_eff"], row["n_eff_ratio"]) == (1, 1.0, 1.0)


def test_coverage_counts_by_stratum_on_a_hand_built_run():
    """Two trees of different stages and agents, with known edges and paths."""
    config = RunConfig(task="t", tree=TreeConfig(max_depth=1, target_good_leaves=3))
    t1 = RootAdded(tree_id="T1", task="t", snapshot="s1", path="/x", score=1.0, stage="early", agent_id="a1")
    t2 = RootAdded(tree_id="T2", task="t", snapshot="s2", path="/x", score=1.0, stage="late", agent_id="a2")
    events = [t1, t2, *fanout("T1"), *fanout("T2", scores=((None, None), (1.2, 1.3), (1.4, 1.1)))]
    events += edge("T2/e1-2", "T2", None, None, slot=1, attempt=2)  # the retry, kept exempt
    cat = catalog_from(events, config)
    stage = coverage(cat, "stage")
    counts = {k: (r["roots"], r["candidate_paths"], r["ranked_paths"], r["selected_paths"]) for k, r in stage.items()}
    assert counts == {"early": (1, 3, 3, 3), "late": (1, 3, 2, 2)}
    late = stage["late"]
    assert (late["kept_edges"], late["kept_exempt_edges"], late["retried_edges"], late["pruned_edges"]) == (3, 1, 1, 0)
    lineage = coverage(cat, "lineage")
    assert set(lineage) == {"t / a1 / early", "t / a2 / late"}
    assert lineage["t / a2 / late"]["n_eff"] == pytest.approx(2.0)  # two disjoint paths of length 1
    assert coverage(cat, "task")["t"]["selected_paths"] == 5 and coverage(cat, "all")["all"]["roots"] == 2


def test_n_eff_of_every_stratum_agrees_with_a_plain_python_reference(runs):
    cat = Catalog.for_log(EventLog(runs, "rounds"))
    pairs = cat.query(
        "select e.tree_id, e.leaf_id, e.edge_id, p.stage, p.depth from int_paths__edges as e "
        "join paths as p using (tree_id, leaf_id) where e.selected"
    )
    groups: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in pairs:
        path = f"{r['tree_id']}:{r['leaf_id']}"
        for key in (("all", "all"), ("stage", r["stage"]), ("depth", str(r["depth"])), ("root", r["tree_id"])):
            groups[key][path].append(r["edge_id"])
    assert len(groups) > 6
    for (stratum, key), paths in groups.items():
        row = coverage(cat, stratum)[key]
        assert row["selected_paths"] == len(paths)
        assert row["n_eff"] == pytest.approx(neff_reference(paths)), (stratum, key)
        assert 0 < row["n_eff_ratio"] <= 1


def test_learnability_band_flags_roots_that_always_or_never_improve():
    config = RunConfig(task="t", tree=TreeConfig(max_depth=1))
    events = [root("T1"), *fanout("T1", scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.1)))]  # all above 1.0
    events += [root("T2", score=5.0), *fanout("T2", scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.1)))]  # none
    events += [root("T3", score=1.35), *fanout("T3", scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.1)))]
    rows = {r["tree_id"]: r for r in catalog_from(events, config).query("select * from learnability")}
    assert {t: (r["improved_edges"], r["kept_edges"], r["band"], r["flagged"]) for t, r in rows.items()} == {
        "T1": (3, 3, "always", True),
        "T2": (0, 3, "never", True),
        "T3": (2, 3, "learnable", False),
    }


def test_tool_error_and_knowledge_analytics_count_the_calls():
    config = RunConfig(task="t", tree=TreeConfig(max_depth=1))
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6, slot=1, calls=4, errors=1, knowledge=True)]
    events += edge("T1/e2-1", "T1", 0.5, 0.6, slot=2, calls=2)
    cat = catalog_from(events, config)
    rates = {(r["dimension"], r["key"]): r for r in cat.query("select * from tool_error_rates")}
    assert (rates[("tool", "read")]["calls"], rates[("tool", "read")]["errors"]) == (12, 2)
    assert rates[("turn", "1")]["error_rate"] == pytest.approx(1 / 6)
    messages = cat.query("select * from tool_error_messages")
    assert [(m["errors"], m["share"]) for m in messages] == [(2, 1.0)]
    usage = cat.query("select * from knowledge_usage where dimension = 'all'")
    assert [(u["area"], u["access"], u["actions"], u["edges"]) for u in usage] == [("notes", "read", 2, 1)]
    improvement = {(r["measure"], r["with_knowledge"]): r for r in cat.query("select * from knowledge_improvement")}
    assert (improvement[("any_action", True)]["improved"], improvement[("any_action", False)]["improved"]) == (1, 0)


def test_messages_that_differ_only_in_paths_and_numbers_group_together():
    con = Catalog.empty().con
    rows = con.execute(
        "select normalized_message(m) from (values ('File not found: /tmp/wt/T001_e1-1/a.py'), "
        "('File not found: /tmp/wt/T002_e3-2/b.py'), ('exit 127 after 3.5 s'), "
        "('Could not find \"abc\" in 1a2b3c4d5e6f')) as v (m)"
    ).fetchall()
    assert [r[0] for r in rows] == [
        "File not found: <path>",
        "File not found: <path>",
        "exit <n> after <n> s",
        "Could not find <text> in <hex>",
    ]


def test_a_planted_bug_in_a_view_is_caught_by_audit_coverage(tmp_path):
    """audit_coverage checks invariants the views keep; break one on purpose and it reports it."""
    views = tmp_path / "views"
    shutil.copytree(VIEWS_DIR, views)
    broken = (views / "paths.sql").read_text().replace("    p.selected,\n", "    true as selected,\n")
    (views / "paths.sql").write_text(broken)
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_depth=2))
    events = [
        RunStarted(command="t", task="t", config=config.model_dump(mode="json")),
        root(),
        *edge("T1/e1-1", "T1", 1.5, 1.6),
        *edge("T1.1/e1-1", "T1.1", 1.9, 1.9),
        *edge("T1.1/e2-1", "T1.1", None, None),
    ]  # an exempt layer-2 edge: a path not ranked
    cat = Catalog.empty(views)
    cat.insert(to_arrow(events, "planted", 1, datetime.now(UTC)))
    problems = cat.query("select problem from audit_coverage")
    assert {"problem": "selected path not ranked"} in problems


# -------------------------------------------------------------- collections


def hand_run(data: Path, run_id: str, task: str) -> None:
    config = RunConfig(task=task, tree=TreeConfig(root_children=1, max_depth=1))
    events = [
        RunStarted(command="explore", task=task, config=config.model_dump(mode="json")),
        RootAdded(tree_id="T1", task=task, snapshot="s", path="/x", score=1.0, stage="middle"),
        *edge("T1/e1-1", "T1", 1.5, 1.6),
    ]
    with LogWriter.create(data, run_id) as writer:
        writer.append(events)
        writer.append([TreeStopped(watermark=writer.tail, tree_id="T1", reason="exhausted")])


@pytest.fixture
def two_runs(tmp_path) -> Path:
    data = tmp_path / "data"
    hand_run(data, "ra", "task-a")
    hand_run(data, "rb", "task-b")
    return data


def test_a_collection_is_the_union_of_its_runs_views(two_runs):
    runs = open_runs(two_runs)
    assert runs.run_ids == ["ra", "rb"]
    assert runs.query("select run_id, task, count(*) as n from trees group by all order by all") == [
        {"run_id": "ra", "task": "task-a", "n": 1},
        {"run_id": "rb", "task": "task-b", "n": 1},
    ]
    tasks = runs.query("select run_id, stratum_key, selected_paths from coverage where stratum = 'task' order by 1")
    assert tasks == [
        {"run_id": "ra", "stratum_key": "task-a", "selected_paths": 1},
        {"run_id": "rb", "stratum_key": "task-b", "selected_paths": 1},
    ]
    one = open_runs(two_runs, ["rb"])
    assert one.query("select distinct run_id from edges") == [{"run_id": "rb"}]
    # The notebook API: polars frames, views as attributes, listed.
    frame = runs.sql("select run_id, n_eff_ratio from coverage where stratum = 'all' order by run_id")
    assert isinstance(frame, pl.DataFrame) and frame["n_eff_ratio"].to_list() == [1.0, 1.0]
    assert runs.trees.height == 2 and "coverage" in runs.views and "trees" in dir(runs)
    with pytest.raises(AttributeError):
        _ = runs.no_such_view


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("copy (select 1) to '{out}/x.csv'", "not a statement of type COPY"),
        ("attach ':memory:' as other", "not a statement of type ATTACH"),
        ("install httpfs", "not a statement of type LOAD"),
        ("load httpfs", "not a statement of type LOAD"),
        ("create table t as select 1", "not a statement of type CREATE"),
        ("insert into trees select * from trees", "not a statement of type INSERT"),
        ("update run_1.main.log_tail set seq = 0", "not a statement of type UPDATE"),
        ("delete from run_1.main.log_tail", "not a statement of type DELETE"),
        ("drop view trees", "not a statement of type DROP"),
        ("set threads = 1", "not a statement of type SET"),
        ("set enable_external_access = true", "not a statement of type SET"),
        ("select * from read_csv('/etc/passwd')", 'Cannot access file "/etc/passwd"'),
        ("select * from read_parquet('s3://bucket/x.parquet')", 'Cannot access file "s3://bucket/x.parquet"'),
        ("select * from read_parquet('{out}/elsewhere.parquet')", "Cannot access file"),
        ("select 1; select 2", "give one query at a time (2 statements given)"),
    ],
)
def test_sql_refuses_what_is_not_a_read_only_query_and_writes_nothing(two_runs, tmp_path, query, message):
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pl.DataFrame({"x": [1]}).to_arrow(), out / "elsewhere.parquet")
    before = sorted(p.name for p in out.iterdir())
    parts = sorted(p.name for p in EventLog(two_runs, "ra").log_dir.iterdir())
    r = CliRunner().invoke(
        cli, ["--data", str(two_runs), "sql", query.format(out=out), "--parquet", str(out / "result.parquet")]
    )
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and message in r.stderr, r.output
    assert "Traceback" not in r.output
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in EventLog(two_runs, "ra").log_dir.iterdir()) == parts


def test_sql_answers_in_a_table_json_csv_and_parquet(two_runs, tmp_path):
    query = "select run_id, tree_id, kept_edges from trees order by run_id"
    base = ["--data", str(two_runs), "sql", query]
    table = CliRunner().invoke(cli, base)
    assert table.exit_code == 0 and table.stdout.splitlines()[0].split() == ["run_id", "tree_id", "kept_edges"]
    assert [line.split() for line in table.stdout.splitlines()[1:]] == [["ra", "T1", "1"], ["rb", "T1", "1"]]
    rows = json.loads(CliRunner().invoke(cli, [*base, "--json"]).stdout)
    assert rows == [{"run_id": r, "tree_id": "T1", "kept_edges": 1} for r in ("ra", "rb")]
    csv = CliRunner().invoke(cli, [*base, "--csv"]).stdout.splitlines()
    assert csv == ["run_id,tree_id,kept_edges", "ra,T1,1", "rb,T1,1"]
    out = tmp_path / "r.parquet"
    r = CliRunner().invoke(cli, [*base, "--parquet", str(out)])
    assert r.exit_code == 0 and "wrote 2 rows" in r.stderr
    assert pq.read_table(out).to_pylist() == rows
    # Only the named runs; the log directory of a run may be read directly.
    log = EventLog(two_runs, "ra").log_dir
    query = f"select count(*) as n from read_parquet('{log}/*.parquet')"
    direct = CliRunner().invoke(cli, ["--data", str(two_runs), "sql", "ra", query, "--json"])
    assert json.loads(direct.stdout) == [{"n": EventLog(two_runs, "ra").tail_seq()}]


def test_the_notebook_api_is_read_only_too(two_runs):
    runs = open_runs(two_runs)
    with pytest.raises(Exception, match="not a statement of type DELETE"):
        runs.sql("delete from run_1.main.log_tail")
    assert runs.query("select count(*) as n from trees")[0]["n"] == 2


# ------------------------------------------------------------------ audit


def test_audit_prints_the_tables_and_exits_0_on_a_healthy_run(runs):
    r = CliRunner().invoke(cli, ["--data", str(runs), "audit", "rounds", "--by", "task,stage,depth"])
    assert r.exit_code == 0, r.output
    for title in (
        "coverage (N_eff/N",
        "roots outside the learnability band",
        "most frequent tool errors",
        "tool-error rate by tool",
        "knowledge actions",
        "cost per task",
    ):
        assert f"\n{title}" in r.stdout
    assert r.stdout.rstrip().endswith("audit: no violations")
    out = json.loads(CliRunner().invoke(cli, ["--data", str(runs), "audit", "rounds", "async", "--json"]).stdout)
    assert out["runs"] == ["rounds", "async"] and out["violations"] == []
    assert {r["stratum"] for r in out["coverage"]} == {"all", "task", "stage"}
    assert {r["run_id"] for r in out["coverage"]} == {"rounds", "async"}
    csv = CliRunner().invoke(cli, ["--data", str(runs), "audit", "rounds", "--csv"]).stdout.splitlines()
    assert csv[0].startswith("run_id,stratum,stratum_key,roots,candidate_paths")
    bad = CliRunner().invoke(cli, ["--data", str(runs), "audit", "--by", "colour"])
    assert bad.exit_code == 2 and "unknown stratum 'colour'" in bad.stderr


def test_audit_exits_1_naming_a_planted_violation(runs, tmp_path):
    from test_replay import first, forge

    data = tmp_path / "data"
    copy_run(runs, "rounds", data)

    def change(rows):
        kept = first(rows, "edge_judged", verdict="kept")
        kept["verdict"], kept["child_id"] = "pruned", None
        change.edge = kept["edge_id"]

    forge(data, "rounds", "planted", change)
    r = CliRunner().invoke(cli, ["--data", str(data), "audit", "planted"])
    assert r.exit_code == 1
    assert f"planted edge_judged {change.edge}: verdict differs" in r.stdout


# ----------------------------------------------------------- reselection


def test_diversity_zero_reproduces_the_default_selection(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    r = CliRunner().invoke(cli, ["--data", str(data), "reselect", "rounds", "--diversity", "0", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["appended"] is True and out["selection_id"] != out["compared_with"]  # recorded apart
    assert out["paths_in"] == [] and out["paths_out"] == []
    default = json.loads(CliRunner().invoke(cli, ["--data", str(data), "paths", "rounds", "--json"]).stdout)
    assert [(p["tree_id"], p["leaf_id"], p["rank"]) for p in out["paths"]] == [
        (p["tree_id"], p["leaf_id"], p["rank"]) for p in default["paths"]
    ]
    overall = out["comparison"][-1]
    assert overall["tree_id"] == "all" and overall["n_eff_ratio"] == overall["n_eff_ratio_default"]


@pytest.mark.slow
def test_diversity_trades_pathscore_for_independent_paths_and_replays(tmp_path):
    """Three paths share edge a (scores 1.9, 1.8, 1.7 at the leaves), a fourth is alone (1.65).
    With k = 2 the plain Top-2 takes two sharing paths; a large lambda takes the lone one."""
    events, config = shared_first_edge()
    config = config.model_copy(
        update={
            "tree": TreeConfig(root_children=2, max_children=3, max_depth=2),
            "paths": config.paths.model_copy(update={"top_k": 2}),
        }
    )
    events += edge("T1/e2-1", "T1", 1.2, 1.3, slot=2)  # T1.2
    events += edge("T1.2/e1-1", "T1.2", 1.6, 1.65)  # T1.2.1, alone below T1.2
    data = tmp_path / "data"
    with LogWriter.create(data, "d") as writer:
        writer.append([RunStarted(command="explore", task="t", config=config.model_dump(mode="json")), *events])
        writer.append([TreeStopped(watermark=writer.tail, tree_id="T1", reason="exhausted")])
    plain = json.loads(CliRunner().invoke(cli, ["--data", str(data), "reselect", "d", "--json"]).stdout)
    assert [p["leaf_id"] for p in plain["paths"]] == ["T1.1.1", "T1.1.2"]
    diverse = CliRunner().invoke(cli, ["--data", str(data), "reselect", "d", "--diversity", "10", "--json"])
    out = json.loads(diverse.stdout)
    assert [p["leaf_id"] for p in out["paths"]] == ["T1.1.1", "T1.2.1"]
    overall = out["comparison"][-1]
    # Plain: a shared, N_eff = 1/4 + 1/4 + 1/2 + 1/2 = 1.5 of 2; diverse: disjoint paths, 2 of 2.
    assert (overall["n_eff_ratio_default"], overall["n_eff_ratio"]) == (pytest.approx(0.75), 1.0)
    assert overall["mean_path_score"] < overall["mean_path_score_default"]
    assert out["weights"]["diversity"] == 10.0
    again = json.loads(
        CliRunner().invoke(cli, ["--data", str(data), "reselect", "d", "--diversity", "10", "--json"]).stdout
    )
    assert again["appended"] is False and again["selection_id"] == out["selection_id"]
    # The hand-built log has no verdicts (replay lists those); both selections re-derive.
    differences = json.loads(CliRunner().invoke(cli, ["--data", str(data), "replay", "d", "--json"]).stdout)
    assert differences["decisions"] == 3 and differences["differences"]
    assert [d for d in differences["differences"] if d["kind"] == "paths_selected"] == []
    for bad, problem in (
        ("-1", "not in the range 0<=x<=1000000"),
        ("nan", "not a finite number"),
        ("1e9", "not in the range 0<=x<=1000000"),
    ):
        r = CliRunner().invoke(cli, ["--data", str(data), "reselect", "d", "--diversity", bad])
        assert r.exit_code == 2 and "Invalid value for '--diversity'" in r.stderr and problem in r.stderr


def test_a_forged_diverse_selection_is_found_by_replay(tmp_path, runs):
    from test_replay import first, forge

    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    assert CliRunner().invoke(cli, ["--data", str(data), "reselect", "rounds", "--diversity", "5"]).exit_code == 0

    def change(rows):
        selection = [r for r in rows if r["kind"] == "paths_selected"][-1]
        paths = json.loads(selection["paths"])
        paths[0]["rank"], paths[1]["rank"] = paths[1]["rank"], paths[0]["rank"]
        selection["paths"] = json.dumps(paths)
        assert first(rows, "paths_selected")["seq"] < selection["seq"]

    forge(data, "rounds", "forged-diverse", change)
    out = json.loads(CliRunner().invoke(cli, ["--data", str(data), "replay", "forged-diverse", "--json"]).stdout)
    assert {(d["kind"], d["problem"]) for d in out["differences"]} == {("paths_selected", "differs")}
