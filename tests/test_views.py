"""Meta-tests over the view catalog: every view builds, documents itself and keeps its grain."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from cli import cli
from engine.catalog import Catalog, read_views
from engine.catalog.definitions import VIEWS_DIR

VIEWS = read_views()
CAMPAIGN = read_views(VIEWS_DIR / "campaign")  # the campaign log's views (engine.campaign)
# whole-run summaries: one row a run, even a run that has only started
ONE_ROW_VIEWS = {
    "run_cost",
    "campaign_spend",
    "run_progress",
    "run_pace",
    "stg_log_tail",
    "int_turns__failing",
    "int_run__finished",
}
# constants of the views (no sources): the same rows on every log
CONSTANT_VIEWS = {"coverage_strata"}


@pytest.fixture(scope="module")
def empty() -> Catalog:
    return Catalog.empty()


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_builds_on_an_empty_log_and_has_a_header(empty, name):
    view = VIEWS[name]
    assert view.summary and not view.summary.startswith("grain")
    assert view.grain, f"{name}: no grain"
    rows = empty.query(f"select * from {name}")
    assert rows == [] or name in CONSTANT_VIEWS  # (no run: no row)
    columns = [d[0] for d in empty.con.execute(f"select * from {name} limit 0").description]
    assert set(view.grain) <= set(columns), f"{name}: grain {view.grain} not in its columns"


@pytest.fixture(scope="module")
def started():
    from conftest import catalog_of

    return catalog_of([])


@pytest.mark.parametrize("name", sorted(ONE_ROW_VIEWS))
def test_a_summary_has_one_row_for_a_run_that_has_only_started(started, name):
    assert [r["run_id"] for r in started.query(f"select * from {name}")] == ["test-run"]


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_declared_sources_match_the_sql(empty, name):
    from engine.catalog import view_sources

    view = VIEWS[name]
    assert set(view.sources) == view_sources(empty.con, view)


def test_only_staging_views_read_the_log_tables(empty):
    from engine.catalog import LOG_RELATIONS, view_sources

    readers = {n for n, v in VIEWS.items() if view_sources(empty.con, v) & LOG_RELATIONS}
    assert readers == {n for n in VIEWS if n.startswith("stg_")} | {"events"}


def test_every_event_kind_has_its_staging_view():
    from ingest.events import CAMPAIGN_KINDS, EVENT_TYPES

    staging = {n[4:] for n in VIEWS if n.startswith("stg_")} - {"log_tail"}
    assert staging == set(EVENT_TYPES) - CAMPAIGN_KINDS
    assert {n[4:] for n in CAMPAIGN if n.startswith("stg_")} == CAMPAIGN_KINDS | {"run_started", "run_finished"}


@pytest.mark.parametrize("name", sorted(CAMPAIGN))
def test_campaign_view_builds_on_an_empty_log_and_reads_what_it_declares(name):
    from engine.catalog import LOG_RELATIONS, view_sources

    empty = Catalog.empty(VIEWS_DIR / "campaign")
    view = CAMPAIGN[name]
    assert view.summary and view.grain
    rows = empty.query(f"select * from {name}")
    assert rows == [] or name == "campaign_state"
    assert set(view.sources) == view_sources(empty.con, view)
    assert name.startswith("stg_") == bool(view_sources(empty.con, view) & LOG_RELATIONS)


def test_views_command_lists_every_view_with_its_header():
    r = CliRunner().invoke(cli, ["views"])
    assert r.exit_code == 0
    for view in VIEWS.values():
        assert f"{view.name}\n    {view.summary}\n    grain: {', '.join(view.grain)}" in r.stdout
    # A summary that runs over two header lines is printed whole (it was cut at its first).
    assert (
        "audit_tree_stopped\n    Recorded tree stops the prefix they saw does not imply, edges started "
        "after a stop, and finished runs with a done tree never stopped (empty when healthy).\n"
    ) in r.stdout


SPEC_COLUMNS = {
    "snapshots": "task, snapshot, global_index, agent_id, commit_hash, eval_ok, score, "
    "score_for_stage, smooth, gain, stage, selected, selection_reason, skip_reason",
    "trees": "tree_id, task, snapshot, stage, root_score, stop_reason, kept_edges, good_leaves, final_leaves",
    "turns": "tree_id, edge_id, turn, session_id, score, eval_status, tool_calls, tool_errors, "
    "knowledge_actions, steps, context_tokens, skipped",
    "edges": "tree_id, edge_id, parent_id, child_id, layer, attempt, s1, s2, eval_ok, edge_score, "
    "tool_error_rate, has_knowledge, improved, outcome, cleanliness, knowledge, "
    "regression_stability, soft, tok, steps, verdict",
    "nodes": "tree_id, node_id, parent_id, depth, score, tok, valid_children, failed_expansions, "
    "process, score_rank, best_rank, q, leaf_reason",
    "selections": "seq, watermark, tree_id, node_id, select, q, t",
    "paths": "tree_id, leaf_id, node_ids, ranked, avg_cleanliness, avg_knowledge, avg_score, "
    "avg_score_rank, max_score, max_score_rank, path_score, rank",
    "top_paths": "tree_id, leaf_id, node_ids, ranked, avg_cleanliness, avg_knowledge, avg_score, "
    "avg_score_rank, max_score, max_score_rank, path_score, rank",
    "tool_calls": "tree_id, edge_id, turn, call_id, tool, status, target, is_knowledge",
    "pairs": "tree_id, node_id, chosen_id, rejected_id, margin, depth, task, stage, chosen_value, rejected_value",
    "labels": "tree_id, edge_id, node_id, layer, verdict, eval_ok, edge_score, improved, soft, value, label",
    "steps": "tree_id, leaf_id, task, stage, steps, edge_ids, step_values, step_labels",
}


@pytest.mark.parametrize("name", sorted(SPEC_COLUMNS))
def test_public_views_have_the_spec_columns(empty, name):
    columns = {d[0] for d in empty.con.execute(f"select * from {name} limit 0").description}
    wanted = {c.strip() for c in SPEC_COLUMNS[name].split(",")}
    assert wanted <= columns, wanted - columns


@pytest.fixture(scope="module")
def sim_log(runs):
    """The data dir and run id of a small finished sim run (four roots)."""
    return runs, "rounds"


@pytest.fixture(scope="module")
def sim_run(sim_log):
    """A catalog over the small sim run, evaluated at every decision."""
    from engine.replay import at_decisions
    from ingest.log import EventLog

    return at_decisions(Catalog.for_log(EventLog(*sim_log)))


def comparable(rows: list[dict]) -> list[str]:
    """Rows in a fixed order, floats to 9 digits (summation order may differ in the last bit)."""
    return sorted(repr({k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()}) for r in rows)


@pytest.mark.slow
def test_tables_refreshed_tree_by_tree_equal_a_full_rebuild(sim_log):
    from ingest.columns import LIGHT_SCHEMA
    from ingest.log import EventLog

    log = EventLog(*sim_log)
    events = log.read_table(LIGHT_SCHEMA.names)
    live = Catalog.empty(threads=1)
    step = 41  # cuts turns and batches at arbitrary places
    for start in range(0, events.num_rows, step):
        live.insert(events.slice(start, step))
        live.query("select * from int_next_work")
    full = Catalog.for_log(log, threads=1)
    for name in live.tables:
        # A tree's "now" point moves only when its own events arrive: its state at
        # an older tail is the same state, so the as-of rows agree but for asof_seq.
        drop = "exclude (asof_seq)" if "asof_seq" in live.views[name].grain else ""
        got, want = (c.query(f"select * {drop} from {name}") for c in (live, full))
        assert got and comparable(got) == comparable(want), name


def test_a_query_computes_only_the_tables_it_reads(sim_log):
    """After a load, tables wait until read; stale trees upstream of a table still to compute whole."""
    from ingest.columns import LIGHT_SCHEMA
    from ingest.log import EventLog

    log = EventLog(*sim_log)
    events = log.read_table(LIGHT_SCHEMA.names)
    cut = events.num_rows * 2 // 3
    live = Catalog.empty(threads=1)
    live.insert(events.slice(0, cut))  # holds RunStarted: every table is computed whole
    live.query("select count(*) from event_log")
    # Nothing computed: a table reading the run's config or events is stale whole, one
    # reading only tree facts (int_edges__evals, int_points) for every tree whose facts arrived.
    trees = [r["tree_id"] for r in live.query("select distinct tree_id from stg_eval_finished order by 1")]
    assert set(live.stale()) == set(live.tables) and all(v in (["*"], trees) for v in live.stale().values())
    assert sorted(n for n, v in live.stale().items() if v != ["*"]) == ["int_edges__evals", "int_points"]
    live.query("select * from int_turns")
    assert "int_turns" not in live.stale() and live.stale()["int_nodes__asof"] == ["*"]
    live.insert(events.slice(cut))  # int_turns: some trees stale; the tree tables: whole
    assert live.stale()["int_turns"] not in ([], ["*"])
    live.query("select * from nodes")
    full = Catalog.for_log(log, threads=1)
    for name in live.tables:
        got, want = (c.query(f"select * from {name}") for c in (live, full))
        assert got and comparable(got) == comparable(want), name


def test_run_progress_counts_the_edges_and_trees_of_the_run(sim_log):
    from ingest.log import EventLog

    catalog = Catalog.for_log(EventLog(*sim_log), threads=1)
    row = catalog.query("select * from run_progress")[0]
    edges = catalog.query("select verdict, count(*) as n from edges group by all")
    by_verdict = {e["verdict"]: e["n"] for e in edges}
    assert sum(by_verdict.values()) > 10
    for verdicts, column in (
        (("kept", "kept_exempt"), "kept_edges"),
        (("kept_exempt",), "kept_exempt_edges"),
        (("pruned",), "pruned_edges"),
        (("retry",), "retried_edges"),
        ((None,), "in_flight_edges"),
    ):
        assert row[column] == sum(by_verdict.get(v, 0) for v in verdicts), column
    statuses = [t["status"] for t in catalog.query("select status from trees")]
    assert (row["trees"], row["trees_done"]) == (len(statuses), statuses.count("done"))


def test_spend_curve_is_campaign_spend_as_of_each_seq(sim_log):
    """The run's spend at a seq is what campaign_spend says over the log up to that seq (a round reading
    the run at its mark), and its last row what it says now."""
    from ingest.log import EventLog

    log = EventLog(*sim_log)
    whole = Catalog.for_log(log, threads=1)
    curve = whole.query("select seq, kept_edges, tokens from spend_curve order by seq")
    now = whole.query("select kept_edges, tokens from campaign_spend")[0]
    assert (curve[-1]["kept_edges"], curve[-1]["tokens"]) == (now["kept_edges"], now["tokens"])
    tail = whole.tail_seq()
    growing = Catalog.empty(threads=1)
    for mark in sorted({1, tail // 5, tail // 3, tail // 2, (3 * tail) // 4, tail}):
        growing.load(log, upto=mark)
        spent = growing.query("select kept_edges, tokens from campaign_spend")[0]
        before = [r for r in curve if r["seq"] <= mark]
        shown = (before[-1]["kept_edges"], before[-1]["tokens"]) if before else (0, 0)
        assert shown == (spent["kept_edges"], spent["tokens"]), mark


def test_an_edge_starting_makes_only_the_as_of_tables_stale(sim_log):
    from ingest.events import EdgeStarted
    from ingest.log import EventLog
    from ingest.schema import to_arrow

    log = EventLog(*sim_log)
    live = Catalog.for_log(log, threads=1)
    live.query("select * from int_next_work")
    unread = {"int_paths__measured", "paths", "int_snapshots__staged", "int_snapshots__picked", "int_edges__evals"}
    assert live.stale() == dict.fromkeys(unread, ["*"])  # a query refreshes only what it reads
    live.query("select * from paths")
    live.query("select * from int_snapshots__picked")
    live.query("select * from int_run__stopping")
    assert live.stale() == {}
    tree = live.query("select tree_id from stg_root_added order by 1 limit 1")[0]["tree_id"]
    started = EdgeStarted(tree_id=tree, edge_id=f"{tree}/e9-1", parent_id=tree, slot=9, attempt=1)
    live.insert(to_arrow([started], log.run_id, log.tail_seq() + 1, datetime.now(UTC)))
    assert live.stale() == {"int_nodes__asof": [tree], "int_trees__asof": [tree]}
    edge = live.query("select * from edges where edge_id = ?", [started.edge_id])[0]
    assert edge["verdict"] is None and edge["s1"] is None and edge["layer"] == 1
    tree_row = live.query("select in_flight from int_trees__asof where tree_id = ? and is_now", [tree])
    assert tree_row[0]["in_flight"] >= 1


@pytest.fixture(scope="module")
def two_runs(runs):
    """One catalog holding both small sim runs (the same tree, node and edge ids, the same seqs),
    evaluated at every decision, and each run's own catalog."""
    from engine.replay import at_decisions
    from ingest.log import EventLog

    both = Catalog.empty()
    both.load_runs([(EventLog(runs, run), None) for run in ("rounds", "async")])  # (in one scan of their parts)
    alone = {run: at_decisions(Catalog.for_log(EventLog(runs, run))) for run in ("rounds", "async")}
    return at_decisions(both), alone


def test_runs_loaded_in_one_scan_hold_each_runs_events_up_to_its_bound(runs):
    from ingest.log import EventLog

    logs = {run: EventLog(runs, run) for run in ("rounds", "async")}
    cut = logs["rounds"].tail_seq() // 2
    one, each = Catalog.empty(), Catalog.empty()
    one.load_runs([(logs["rounds"], cut), (logs["async"], None)])
    each.load(logs["rounds"], upto=cut)
    each.load(logs["async"])
    every = "select * from event_log order by run_id, seq"
    assert one.query(every) == each.query(every)
    assert (one.tail_seq("rounds"), one.tail_seq("async")) == (cut, logs["async"].tail_seq())
    one.load_runs([(log, None) for log in logs.values()])  # the rest of the one that was cut, nothing twice
    whole = Catalog.for_log(logs["rounds"]).query("select * from event_log order by seq")
    assert one.query(every) == each.query("select * from event_log where run_id = 'async' order by seq") + whole


def test_the_two_runs_share_their_ids(two_runs):
    both, _ = two_runs
    shared = both.query(
        "select count(*) as n from (select tree_id, node_id from nodes where run_id = 'rounds' "
        "intersect select tree_id, node_id from nodes where run_id = 'async')"
    )
    assert shared[0]["n"] >= 8  # (so the next test would see rows of one run meet the other's)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_view_is_keyed_by_run_first(empty, name):
    columns = [d[0] for d in empty.con.execute(f"select * from {name} limit 0").description]
    if name in CONSTANT_VIEWS:
        assert "run_id" not in columns
    else:
        assert VIEWS[name].grain[0] == "run_id", f"{name}: grain {VIEWS[name].grain} does not start with run_id"
        assert columns[0] == "run_id", f"{name}: its first column is {columns[0]}"


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_catalog_of_two_runs_gives_each_run_the_rows_of_its_own_catalog(two_runs, name):
    both, alone = two_runs
    for run, catalog in alone.items():
        want = catalog.query(f"select * from {name}")
        got = both.query(f"select * from {name} where run_id = ?", [run]) if name not in CONSTANT_VIEWS else None
        assert comparable(got if got is not None else both.query(f"select * from {name}")) == comparable(want)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_grain_is_unique_on_a_real_run(sim_run, name):
    grain = ", ".join(VIEWS[name].grain)
    rows = sim_run.query(f"select count(*) as n from {name}")[0]["n"]
    dupes = sim_run.query(f"select {grain}, count(*) as n from {name} group by all having count(*) > 1 limit 3")
    assert dupes == [], f"{name}: grain ({grain}) repeats"
    if name.startswith("audit_"):
        assert rows == 0, sim_run.query(f"select * from {name} limit 3")


def definitions(catalog: Catalog) -> list[tuple]:
    """Everything a catalog defines: views with their SQL, tables with their columns, macros, comments."""
    import re

    con = catalog.con
    views = con.execute("select view_name, sql, comment from duckdb_views() where not internal order by 1").fetchall()

    def ordered(sql: str) -> str:  # DuckDB prints an EXCLUDE list in no fixed order
        return re.sub(r"EXCLUDE \(([^)]*)\)", lambda m: f"EXCLUDE ({', '.join(sorted(m[1].split(', ')))})", sql)

    return [
        *[(name, ordered(sql), comment) for name, sql, comment in views],
        *con.execute(
            "select table_name, column_name, data_type, column_index from duckdb_columns() "
            "where database_name = current_database() order by 1, 4"
        ).fetchall(),
        *con.execute("select table_name, comment, has_primary_key from duckdb_tables() order by 1").fetchall(),
        *con.execute(
            "select function_name, macro_definition from duckdb_functions() "
            "where function_type = 'macro' and database_name = current_database() order by 1, 2"
        ).fetchall(),
    ]


def test_a_later_catalog_of_the_process_is_copied_from_its_file_and_equals_one_built(tmp_path):
    """Catalog.empty copies this process's empty catalog (a file) rather than binding every view again; a
    file that cannot be used is dropped and the catalog built from the SQL."""
    import duckdb

    from engine.catalog import templates
    from engine.catalog.definitions import load_graph

    built = Catalog(duckdb.connect())  # from the views' SQL, no file
    Catalog.empty()  # the process keeps a file (when none was kept yet)
    key = next(k for k in templates._FILES if k[1] == templates.digest(load_graph()))
    path = templates._FILES[key]
    assert path.parent.stat().st_mode & 0o777 == 0o700  # only this user enters it
    copied = Catalog.empty()
    assert definitions(copied) == definitions(built) and len(definitions(built)) > 300
    path.write_bytes(b"not a database")  # damaged: the next catalog is built, and kept again
    again = Catalog.empty()
    assert definitions(again) == definitions(built)
    assert templates._FILES[key] == path and path.read_bytes()[:4] != b"not "
    assert definitions(Catalog.empty()) == definitions(built)


def test_the_catalog_files_of_a_killed_process_are_removed_and_a_running_ones_kept(tmp_path):
    """A process killed before its exit leaves its directory of catalog files: the next process's sweep removes it."""
    import subprocess
    import sys

    from engine.catalog import templates

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{templates.PREFIX}{gone.pid}-x"
    running = tmp_path / f"{templates.PREFIX}{os.getpid()}-y"
    for d in (dead, running):
        (d / "catalog-0.duckdb").parent.mkdir()
        (d / "catalog-0.duckdb").write_bytes(b"x")
    templates._sweep(tmp_path)
    assert not dead.exists() and running.exists()


def test_a_selection_id_recorded_twice_stands_for_its_latest_record_in_every_view():
    """A reselection under an id already recorded replaces it: paths, labels, pairs and step paths each show
    the later record's rows only (the macro latest_record, the one statement of the rule)."""
    from conftest import catalog_of

    from ingest.events import PathsSelected, SupervisionSelected

    def paths(leaf: str) -> list[dict]:
        return [{"tree_id": "T", "leaf_id": leaf, "node_ids": ["T", leaf], "rank": 1, "path_score": 1.0}]

    def supervision(watermark: int, edge: str) -> SupervisionSelected:
        return SupervisionSelected(
            watermark=watermark,
            selection_id="s",
            rule="soft",
            min_margin=0.1,
            threshold=0.5,
            pairs=[{"tree_id": "T", "node_id": "T", "depth": 0, "chosen_id": edge, "rejected_id": "x", "margin": 1}],
            labels=[{"tree_id": "T", "edge_id": edge, "node_id": "T", "layer": 1, "value": 1.0, "label": True}],
            step_paths=[{"tree_id": "T", "leaf_id": edge, "edge_ids": [edge], "step_values": [1.0]}],
        )

    events = [
        PathsSelected(watermark=1, selection_id="p", weights={}, top_k=1, paths=paths("T.1")),
        supervision(2, "e1"),
        PathsSelected(watermark=3, selection_id="p", weights={}, top_k=1, paths=paths("T.2")),
        supervision(4, "e2"),
        PathsSelected(watermark=5, selection_id="other", weights={}, top_k=1, paths=paths("T.1")),
    ]
    cat = catalog_of(events)
    rows = cat.execute("select selection_id, leaf_id from int_paths__recorded order by all").fetchall()
    assert rows == [("other", "T.1"), ("p", "T.2")]
    assert cat.execute("select edge_id from int_labels__recorded").fetchall() == [("e2",)]
    assert cat.execute("select chosen_id from int_pairs__recorded").fetchall() == [("e2",)]
    assert cat.execute("select leaf_id from int_steps__recorded").fetchall() == [("e2",)]
