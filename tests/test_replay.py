"""Replay, forged logs, replay of a run being written, paths and reselect commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import ENDLESS, ROOT, copied_runs, copy_run, copy_with_other_knowledge

from benchmarks.logs import tile
from cli import cli
from engine.catalog import Catalog
from engine.selections import default_parameters, top_paths
from ingest.errors import LogError
from ingest.log import EventLog, run_dir


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


@pytest.fixture(scope="module")
def runs(runs, tmp_path_factory) -> Path:
    """The shared runs, copied: this module forges runs beside them (bad-config, tiled, ...)."""
    return copied_runs(runs, tmp_path_factory, "replayed")


@pytest.mark.parametrize("run", ["rounds", "async"])
def test_replay_passes_on_sim_runs(runs, run):
    r = invoke(runs, "replay", run, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["differ"] == 0 and out["differences"] == []
    kinds = json.loads(invoke(runs, "replay", run, "--json").stdout)["decisions"]
    assert kinds > 100
    assert len(out["trees"]) == 4
    assert sum(t["kept_edges"] for t in out["trees"]) > 20


def test_the_benchmarks_plain_python_baseline_agrees_with_replay(runs):
    """benchmarks/plain_replay.py re-derives every decision independently of the views; the
    collection benchmark stops when it and replay disagree, so a rule the views gained and the
    baseline lacks (the supervision rule's against_verdict, once) breaks the benchmark."""
    from benchmarks.collection import summary
    from benchmarks.plain_replay import replay

    r = invoke(runs, "replay", "--json")
    assert r.exit_code == 0, r.output
    plain = [replay(runs, run) for run in ("async", "rounds")]
    assert [p.differences for p in plain] == [[], []]
    counted = {k: sum(getattr(p, k) for p in plain) for k in ("trees", "nodes", "decisions", "edges")}
    assert summary("replay", json.loads(r.stdout)) == {**counted, "differ": 0}


def test_replay_times_each_of_its_phases(runs):
    """The benchmark's breakdown: every phase timed, in order, adding up to the whole."""
    from engine.replay import PHASES, replay_run

    start = time.perf_counter()
    result = replay_run(runs, "rounds")
    elapsed = time.perf_counter() - start
    assert list(result.seconds) == list(PHASES)
    assert all(s > 0 for s in result.seconds.values())
    assert sum(result.seconds.values()) <= elapsed
    # Nothing slow left untimed: only the log's listing is (milliseconds); the bound is
    # loose so that a pause of a loaded machine there cannot fail it.
    assert sum(result.seconds.values()) > 0.5 * elapsed


@pytest.mark.slow
def test_replay_prints_trees_and_the_summary_line(runs):
    r = invoke(runs, "replay", "rounds", "--tree", "T002")
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0].split()[:6] == [
        "tree_id",
        "nodes",
        "kept_edges",
        "kept_exempt_edges",
        "pruned_edges",
        "retried_edges",
    ]
    assert r.stdout.splitlines()[1].split()[0] == "T002" and r.stdout.splitlines()[2] == ""  # its row alone
    assert invoke(runs, "replay", "rounds").stdout.splitlines()[1].split()[0] == "T001"  # every tree's
    assert "tree T002 (* = on a selected path" in r.stdout
    assert "\n* T002  score " in r.stdout and "leaf: " in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].endswith("decisions re-derived, 0 differ")
    drawing = json.loads(invoke(runs, "replay", "rounds", "--tree", "T002", "--json").stdout)["drawing"]
    assert drawing["tree_id"] == "T002" and "\n".join(drawing["lines"]) in r.stdout
    for extra in ([], ["--json"]):  # an unknown tree: the error alone, not half a report
        r = invoke(runs, "replay", "rounds", "--tree", "T999", *extra)
        assert r.exit_code == 1 and "no tree 'T999'" in r.stderr and r.stdout == ""


def forge(data: Path, src: str, dst: str, change) -> None:
    """Copy run ``src`` to ``dst`` with ``change(rows)`` applied to its events."""
    table = EventLog(data, src).read_table()
    rows = [dict(r, run_id=dst) for r in table.to_pylist()]  # the copy's own events
    change(rows)
    out = run_dir(data, dst) / "log"
    out.mkdir(parents=True)
    forged = pa.Table.from_pylist(rows, schema=table.schema)
    pq.write_table(forged, out / f"part-{1:012d}-{len(rows):012d}-L0.parquet")


def test_resume_of_a_log_whose_recorded_config_is_invalid_is_a_clean_error(runs):
    def change(rows):
        rows[:] = [r for r in rows if r["kind"] != "run_finished"]  # the last event
        started = first(rows, "run_started")
        config = json.loads(started["config"])
        config["tree"]["max_depth"] = 0
        started["config"] = json.dumps(config)

    forge(runs, "rounds", "bad-config", change)
    before = EventLog(runs, "bad-config").tail_seq()
    r = invoke(runs, "explore", "--resume", "bad-config")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and "the recorded run config is not valid" in r.stderr
    assert "tree.max_depth" in r.stderr
    assert EventLog(runs, "bad-config").tail_seq() == before


def test_a_log_recording_a_regex_duckdb_cannot_compile_is_named(runs):
    def change(rows):
        rows[:] = [r for r in rows if r["kind"] != "run_finished"]
        started = first(rows, "run_started")
        config = json.loads(started["config"])
        config["knowledge"]["path_regex"] = "(["
        started["config"] = json.dumps(config)

    forge(runs, "rounds", "bad-regex", change)
    log = EventLog(runs, "bad-regex")
    before = log.tail_seq()
    for command in (["replay", "bad-regex"], ["explore", "--resume", "bad-regex"]):
        r = invoke(runs, *command)
        assert r.exit_code == 1 and "Traceback" not in r.output, command
        assert r.stderr.startswith(
            f"Error: {log.dir}: the recorded run config is not valid "
            "(knowledge.path_regex: Value error, not a regular expression"
        )
        assert "views/" not in r.stderr  # the log is at fault, not a view
    assert log.tail_seq() == before


def test_paths_of_a_run_without_a_selection_yet(runs):
    forge(
        runs,
        "rounds",
        "unselected",
        lambda rows: rows.__setitem__(
            slice(None),
            [r for r in rows if r["kind"] not in ("paths_selected", "supervision_selected", "run_finished")],
        ),
    )
    r = invoke(runs, "paths", "unselected")
    assert r.exit_code == 1 and "has no path selection yet (is it still running?)" in r.stderr


def test_json_output_writes_a_non_finite_number_as_null(runs):
    def change(rows):
        selection = first(rows, "paths_selected")
        paths = json.loads(selection["paths"])
        paths[0]["path_score"] = float("nan")  # as an older version could record
        selection["paths"] = json.dumps(paths)

    forge(runs, "rounds", "nan-score", change)
    r = invoke(runs, "paths", "nan-score", "--json")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    out = json.loads(r.stdout)
    assert out["paths"][0]["path_score"] is None and out["paths"][1]["path_score"] > 0


def first(rows, kind, **match):
    return next(r for r in rows if r["kind"] == kind and all(r[k] == v for k, v in match.items()))


def test_replay_names_each_forged_decision(runs):
    def change(rows):
        # A selection that picked another node than the highest Select.
        def other_node(sel):
            return next(
                (
                    n["child_id"]
                    for n in rows
                    if n["kind"] == "edge_judged"
                    and n["child_id"]
                    and n["tree_id"] == sel["tree_id"]
                    and n["child_id"] != sel["node_id"]
                    and n["seq"] < sel["watermark"]
                ),
                None,
            )

        wrong = next(r for r in rows if r["kind"] == "node_selected" and other_node(r))
        sibling = other_node(wrong)
        wrong["node_id"] = sibling
        # A verdict that contradicts the facts.
        kept = first(rows, "edge_judged", verdict="kept")
        kept["verdict"], kept["child_id"] = "pruned", None
        # A tree stop recorded at a watermark where the tree could not stop yet.
        stop = first(rows, "tree_stopped")
        stop["watermark"] = first(rows, "root_added", tree_id=stop["tree_id"])["seq"]
        change.expected = {
            ("node_selected", sibling),
            ("edge_judged", kept["edge_id"]),
            ("tree_stopped", stop["tree_id"]),
        }

    forge(runs, "rounds", "forged", change)
    r = invoke(runs, "replay", "forged", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    found = {(d["kind"], d["subject"]): d for d in out["differences"]}
    for key in change.expected:
        assert key in found, (key, out["differences"])
    assert (
        found[("tree_stopped", next(s for k, s in change.expected if k == "tree_stopped"))]["problem"]
        == "stopped too early"
    )
    judged = found[next(k for k in change.expected if k[0] == "edge_judged")]
    assert judged["problem"] == "verdict differs" and judged["recorded"] == "pruned"
    text = invoke(runs, "replay", "forged")
    assert text.exit_code == 1
    assert "differ" in text.stdout.splitlines()[-1] and not text.stdout.rstrip().endswith(" 0 differ")


def test_a_forged_snapshot_pick_and_path_selection_are_found(runs):
    def change(rows):
        picked = first(rows, "snapshots_picked")
        detail = json.loads(picked["detail"])
        detail[0]["stage"] = "late" if detail[0]["stage"] != "late" else "early"
        picked["detail"] = json.dumps(detail)
        selection = first(rows, "paths_selected")
        paths = json.loads(selection["paths"])
        paths[0]["rank"] = 99
        selection["paths"] = json.dumps(paths)

    forge(runs, "rounds", "forged2", change)
    out = json.loads(invoke(runs, "replay", "forged2", "--json").stdout)
    kinds = {d["kind"] for d in out["differences"]}
    assert kinds == {"snapshots_picked", "paths_selected"}


def test_a_path_selection_that_tree_facts_follow_is_re_derived_at_its_watermark(runs):
    """Two copies of a run back to back (the benchmark's tiling), keeping the first copy's
    path selection: it sits between them and saw only the first copy's trees."""
    tile(runs, "rounds", "twice", 2, select_at_end=False)
    out = json.loads(invoke(runs, "replay", "twice", "--json").stdout)
    assert out["differ"] == 0, out["differences"][:3]
    assert len(out["trees"]) == 8
    rows = EventLog(runs, "twice").read_table(["seq", "kind", "paths"]).to_pylist()
    selection = first(rows, "paths_selected")
    assert {p["tree_id"] for p in json.loads(selection["paths"])} == {"T0001", "T0002", "T0003", "T0004"}
    assert any(r["kind"] == "tool_called" and r["seq"] > selection["seq"] for r in rows)
    # So it was checked at its watermark: the log now gives the second copy's trees paths too.
    catalog = Catalog.for_log(EventLog(runs, "twice"))
    now = top_paths(catalog, *default_parameters(catalog))
    assert len({p["tree_id"] for p in now}) == 8


def test_the_benchmark_tiling_ends_as_an_exploration_does(runs):
    """By default the tiled run ends with one path and one supervision selection over every tree, then RunFinished."""
    tile(runs, "rounds", "tiled", 3)
    rows = EventLog(runs, "tiled").read_table(["seq", "kind", "watermark", "paths", "labels"]).to_pylist()
    assert [r["kind"] for r in rows[-3:]] == ["paths_selected", "supervision_selected", "run_finished"]
    assert sum(r["kind"] == "paths_selected" for r in rows) == 1
    assert sum(r["kind"] == "supervision_selected" for r in rows) == 1
    assert rows[-3]["watermark"] == rows[-4]["seq"]
    assert len({p["tree_id"] for p in json.loads(rows[-3]["paths"])}) == 12
    assert len({p["tree_id"] for p in json.loads(rows[-2]["labels"])}) == 12
    out = json.loads(invoke(runs, "replay", "tiled", "--json").stdout)
    assert out["differ"] == 0, out["differences"][:3]


@pytest.mark.slow
def test_replay_checks_the_prefix_of_a_run_being_written(runs, tmp_path):
    """Replays while the run goes on (one that never ends on its own: the test stops it
    after three replays, so no speed of the machine makes it end first)."""
    data = tmp_path / "data"
    config = tmp_path / "endless.toml"
    config.write_text(ENDLESS)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(ROOT / "data" / "student_run" / "all_snapshots"),
            "--select",
            "--task",
            "k",
            "--num-roots",
            "3",
            "--run-id",
            "live",
            "--config",
            str(config),
            "--parallel",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    checked = []
    deadline = time.monotonic() + 600
    try:
        while len(checked) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            if EventLog(data, "live").exists():
                r = invoke(data, "replay", "live", "--json")
                assert r.exit_code == 0, r.output
                checked.append(json.loads(r.stdout)["decisions"])
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    assert checked == sorted(checked) and checked[0] < checked[-1]


def test_paths_command_prints_the_default_selection(runs):
    r = invoke(runs, "paths", "rounds", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["top_k"] == 6 and out["weights"] == {"max": 0.35, "avg": 0.25, "clean": 0.2, "know": 0.2}
    assert {p["tree_id"] for p in out["paths"]} == {"T001", "T002", "T003", "T004"}
    fields = {
        "avg_cleanliness",
        "avg_knowledge",
        "avg_score",
        "avg_score_rank",
        "max_score",
        "max_score_rank",
        "path_score",
        "tree_id",
        "leaf_id",
        "node_ids",
        "task",
        "stage",
    }
    assert fields <= set(out["paths"][0])
    csv = invoke(runs, "paths", "rounds", "--tree", "T001", "--csv")
    lines = csv.stdout.strip().splitlines()
    assert lines[0].startswith("tree_id,leaf_id,rank,path_score") and all(
        line.startswith("T001,") for line in lines[1:]
    )
    header = lines[0].split(",")  # the columns --json has: task and snapshot too
    assert {"task", "stage", "snapshot", "node_ids"} <= set(header)
    first = dict(zip(header, lines[1].split(","), strict=True))
    assert first["task"] == "kernel-speedup" and first["snapshot"] == out["paths"][0]["snapshot"]
    assert invoke(runs, "paths", "rounds", "--selection", "nope").exit_code == 1


@pytest.mark.slow
def test_reselect_appends_once_per_parameters_and_reports_the_difference(runs, tmp_path):
    forge(runs, "rounds", "re", lambda rows: None)
    before = EventLog(runs, "re").tail_seq()
    r = invoke(runs, "reselect", "re", "--weights", "max=0,avg=0,clean=0,know=1", "--top-k", "2", "--json")
    assert r.exit_code == 0, r.output
    first_out = json.loads(r.stdout)
    assert first_out["appended"] is True
    assert all(sum(p["tree_id"] == t for p in first_out["paths"]) <= 2 for t in ("T001", "T002"))
    assert len(first_out["paths_out"]) >= 8  # at most 2 of each root's 6 stay
    again = json.loads(
        invoke(runs, "reselect", "re", "--weights", "know=1,max=0,avg=0,clean=0", "--top-k", "2", "--json").stdout
    )
    assert again["appended"] is False and again["selection_id"] == first_out["selection_id"]
    assert EventLog(runs, "re").tail_seq() == before + 1
    shown = invoke(runs, "paths", "re", "--selection", first_out["selection_id"], "--json")
    assert json.loads(shown.stdout)["paths"] == first_out["paths"]
    assert invoke(runs, "replay", "re").exit_code == 0
    text = invoke(runs, "reselect", "re", "--weights", "know=1,max=0,avg=0,clean=0", "--top-k", "2")
    assert "already recorded" in text.stdout and "paths in" in text.stdout
    assert "note: the weights sum" not in text.stdout
    unscaled = invoke(runs, "reselect", "re", "--weights", "max=1,avg=1")  # clean, know: the run's 0.2 each
    assert unscaled.exit_code == 0, unscaled.output
    note = "note: the weights sum to 2.4, not 1: these path scores are on another scale"
    assert unscaled.stdout.splitlines()[1] == note
    for weights, problem in (
        ("speed=1", "expected key=value"),
        ("max=nan", "finite"),
        ("know=inf", "finite"),
        ("max=0.3,max=0.4", "given twice"),
    ):
        bad = invoke(runs, "reselect", "re", "--weights", weights)
        assert bad.exit_code == 2 and "Error: --weights: " in bad.stderr and problem in bad.stderr, weights
    for k in ("0", str(2**63)):
        bad = invoke(runs, "reselect", "re", "--top-k", k)
        assert bad.exit_code == 2 and f"Invalid value for '--top-k': {k} is not in the range 1<=x<=" in bad.stderr
        assert "Traceback" not in bad.output
    assert EventLog(runs, "re").tail_seq() == before + 2


def test_weights_whose_scores_could_overflow_or_all_be_zero_are_refused(tmp_path, runs):
    """Weights near the float limit made Select and PathScore inf or NaN (every path tied,
    recorded for good); all-zero path weights scored every path 0. Both are refused, in a
    config file and in reselect alike, before anything is recorded."""
    snapshots = ROOT / "data" / "student_run" / "all_snapshots"
    data = tmp_path / "data"
    for body, problem in (
        ("[paths]\nmax = 1e308\n", "paths.max: Value error, must be between -1e+06 and 1e+06"),
        ("[q]\nprocess = -1e308\n", "q.process: Value error, must be between"),
        ("[tree]\nalpha = 1e308\n", "tree.alpha: Input should be less than or equal to"),
        ("[paths]\nmax = 0\navg = 0\nclean = 0\nknow = 0\n", "are all 0: every path would score 0"),
    ):
        config = tmp_path / "weights.toml"
        config.write_text(body)
        r = invoke(data, "explore", str(snapshots), "--select", "--task", "kernel-speedup", "--config", str(config))
        assert r.exit_code == 1 and problem in r.stderr, (body, r.output)
    assert not (data / "runs").exists()
    forge(runs, "rounds", "weights", lambda rows: None)
    before = EventLog(runs, "weights").tail_seq()
    for weights, problem in (
        ("max=1e308", "max: Value error, must be between"),
        ("max=0,avg=0,clean=0,know=0", "every path would score 0"),
    ):
        r = invoke(runs, "reselect", "weights", "--weights", weights)
        assert r.exit_code == 2 and "Error: --weights: " in r.stderr and problem in r.stderr, r.output
    assert EventLog(runs, "weights").tail_seq() == before


def test_equal_recorded_and_derived_scores_never_differ_infinities_included():
    """A log of an older version could record inf or NaN scores; replay's comparison of
    recorded and derived values (the views' differs macro) must not flag equal ones."""
    con = Catalog.empty().con
    rows = con.execute(
        "select differs(a, b) as d from (values (1.0, 1.0 + 1e-12), ('inf'::double, 'inf'::double), "
        "('-inf'::double, '-inf'::double), ('nan'::double, 'nan'::double), (1.0, 1.1), "
        "('inf'::double, 1.0)) as v (a, b)"
    ).fetchall()
    assert [r[0] for r in rows] == [False, False, False, False, True, True]


@pytest.mark.slow
def test_a_part_with_damaged_pages_is_named_however_the_scan_fails(runs, tmp_path):
    """DuckDB reports damaged pages at different points of a scan, depending on its
    threads' timing (CI once saw the error without the part's name); each of many
    loads must name the part. The parts are renamed as before checksums (whose
    damage only the scan finds: with a checksum the check before it names the part)."""
    data = tmp_path / "data"
    shutil.copytree(run_dir(runs, "rounds"), run_dir(data, "rounds"))
    log = EventLog(data, "rounds")
    originals = {}
    for p in log.parts():
        (p.path.parent / "_record.jsonl").unlink(missing_ok=True)  # a run before records and checksums
        legacy = p.path.with_name(re.sub(r"-[0-9a-f]{32}\.parquet$", ".parquet", p.path.name))
        p.path.rename(legacy)
        originals[legacy] = run_dir(runs, "rounds").joinpath("log", p.path.name)
    catalog = Catalog.empty()
    merged = [p.path for p in log.parts() if p.level > 0][:3]
    assert merged, "the run has no merged part (several row groups) to damage"
    for part in merged:
        raw = bytearray(part.read_bytes())
        raw[8:400] = bytes(392)  # the first row group's first column chunks
        part.write_bytes(bytes(raw))
        for _ in range(20):
            with pytest.raises(LogError, match=re.escape(f"{part}: cannot read the log")):
                catalog.load(log)
        part.write_bytes(originals[part].read_bytes())
    catalog.load(log)  # restored: the failed loads left nothing behind
    assert catalog.query("select count(*) as n from event_log")[0]["n"] == EventLog(runs, "rounds").tail_seq()


@pytest.mark.parametrize("named", ["checksummed", "before_checksums"])
@pytest.mark.parametrize("damage", ["not_parquet", "bad_pages", "foreign", "seq_as_text", "other_seqs", "row_dropped"])
def test_replay_names_a_damaged_part_and_exits_1(runs, tmp_path, damage, named):
    """A part named with a checksum fails it; one named without (written before checksums)
    is still checked: its footer, and the pages DuckDB's scan decodes."""
    data = tmp_path / "data"
    shutil.copytree(run_dir(runs, "rounds"), run_dir(data, "rounds"))
    parts = sorted(run_dir(data, "rounds").glob("log/*.parquet"))
    part = parts[len(parts) // 2]
    if named == "before_checksums":
        (part.parent / "_record.jsonl").unlink()  # a run before records and checksums
        part = part.rename(part.with_name(re.sub(r"-[0-9a-f]{32}\.parquet$", ".parquet", part.name)))
    raw = bytearray(part.read_bytes())
    table = pq.read_table(part)
    seq = table.column_names.index("seq")
    if damage == "not_parquet":
        raw[-4:] = b"XXXX"  # the footer magic
    elif damage == "bad_pages":
        raw[8:400] = bytes(392)  # the first column chunk's pages
    if damage in ("not_parquet", "bad_pages"):
        part.write_bytes(bytes(raw))
    elif damage == "foreign":  # valid Parquet, not events: it was read as no events
        pq.write_table(pa.table({"x": list(range(table.num_rows))}), part)
    elif damage == "seq_as_text":
        pq.write_table(table.set_column(seq, "seq", pc.cast(table["seq"], pa.string())), part)
    elif damage == "other_seqs":  # as many rows, shifted: read as other events before
        pq.write_table(table.set_column(seq, "seq", pc.add(table["seq"], 1)), part)
    else:
        pq.write_table(table.slice(1), part)
    for command in (["replay", "rounds"], ["paths", "rounds"], ["explore", "--resume", "rounds"]):
        r = invoke(data, *command)
        assert r.exit_code == 1, (command, r.output)
        assert str(part) in r.output and "Traceback" not in r.output
        assert not isinstance(r.exception, Exception)  # a clean exit 1, not a crash
    with pytest.raises(LogError, match=re.escape(str(part))):
        EventLog(data, "rounds").read_table()


def test_runs_replayed_together_each_give_their_own_result_in_run_order(runs, tmp_path, monkeypatch):
    """A collection's runs are replayed together in one catalog; each result is what its run replayed
    alone gives (a forged run's differences stay its own), in run order; runs that cannot share a catalog
    (other variable defaults), and a batch's run that cannot be read, are replayed a run at a time."""
    from engine import replay
    from engine.replay import replay_run, replay_runs

    data = tmp_path / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)

    def change(rows):
        kept = first(rows, "edge_judged", verdict="kept")
        kept["verdict"], kept["child_id"] = "pruned", None
        change.edge = kept["edge_id"]

    forge(data, "rounds", "forged", change)
    order = ["rounds", "forged", "async"]

    def shown(r):
        return (r.run_id, r.decisions, r.trees, [vars(d) for d in r.differences])

    batches = []  # (the batches replayed together: their runs)
    together_of = replay._replay_together
    monkeypatch.setattr(replay, "_replay_together", lambda logs: batches.append(logs) or together_of(logs))
    alone = [shown(replay_run(data, run)) for run in order]
    together = [shown(r) for r in replay_runs(data, order)]
    assert [[log.run_id for log in b] for b in batches] == [order]
    assert [r[0] for r in together] == order
    assert together == alone
    differences = {run: found for run, _, _, found in together}
    assert differences["rounds"] == differences["async"] == []
    assert ("edge_judged", change.edge, "verdict differs") in [
        (d["kind"], d["subject"], d["problem"]) for d in differences["forged"]
    ]
    # a run of other defaults: no batch holds it, and every result is still its run's alone
    copy_with_other_knowledge(data, "async", "other")
    order.append("other")
    assert [shown(r) for r in replay_runs(data, order)] == [*alone, shown(replay_run(data, "other"))]
    with pytest.raises(LogError, match="nope"):
        next(replay_runs(data, ["rounds", "nope"], workers=2))  # every run is checked to exist first


def _audited(events: pa.Table) -> list[dict]:
    from engine.replay import at_decisions

    catalog = Catalog.empty()
    catalog.insert(events)
    at_decisions(catalog)
    return catalog.query("select * from audit_edge_judged")


def test_a_verdict_is_missing_only_once_the_engine_judged_after_its_edge(runs):
    """A prefix ending between a batch's turns and its verdicts (a signal there) misses nothing;
    a verdict dropped from the middle of the log, or at the end of a finished run, is named."""
    from ingest.reader import read_whole

    events = pa.concat_tables([read_whole(p) for p in EventLog(runs, "rounds").parts()], promote_options="default")
    kinds = events.column("kind").to_pylist()
    seqs = events.column("seq").to_pylist()
    first = kinds.index("edge_judged")
    unjudged = events.slice(0, first)  # the turns of the first batch, none of its verdicts
    assert any(k == "turn_finished" for k in kinds[:first])
    assert _audited(unjudged) == []
    dropped = pc.not_equal(events.column("seq"), pa.scalar(seqs[first]))  # one verdict forged away
    missing = _audited(events.filter(dropped))
    assert [(r["problem"], r["subject"]) for r in missing] == [
        ("no verdict recorded", events.column("edge_id")[first].as_py())
    ]
