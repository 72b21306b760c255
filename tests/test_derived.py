"""Derived state that outlives a process (engine/derived/): keyed by the run's record, the
views and the variables; reused while they hold, caught up when a run grows, rebuilt when
anything else changes, never trusted over the log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, SMALL, SNAPSHOTS, copy_run, copy_with_other_knowledge
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import cli
from engine.catalog.definitions import VIEWS_DIR
from engine.collection import open_runs
from engine.derived import AT_DECISIONS, NOW, Derived
from engine.derived.files import check_named, load_json
from engine.replay import replay_run
from ingest.events import RunResumed
from ingest.log import EventLog, LogWriter

QUERIES = (
    "select run_id, tree_id, nodes, kept_edges, stop_reason from trees order by all",
    "select run_id, tree_id, leaf_id, path_score from paths order by all",
    "select run_id, stratum, stratum_key, selected_paths, n_eff from coverage order by all",
    "select run_id, count(*) as n, max(seq) as tail from events group by all order by all",
    "select run_id, count(*) as n from audit_node_selected group by all order by all",
)


def answers(data: Path) -> dict[str, list]:
    runs = open_runs(data)
    return {q: runs.query(q) for q in QUERIES}


def states(data: Path) -> list[Path]:
    return sorted((data / "derived").glob("*/*/*/state.json"))


def assert_whole(state_dir: Path) -> None:
    """A stored state's document and every file in it hold what their checks and digests record."""
    relative = "/".join(state_dir.parts[-3:])
    held = load_json(state_dir / "state.json", relative)
    assert held is not None
    files = [state_dir / "tables" / name for name in held["tables"].values()]
    for path in [*files, *(state_dir / "views").glob("*.parquet")]:
        check_named(path, relative)


@pytest.fixture
def data(runs, tmp_path) -> Path:
    """A copy of the session's two small runs (rounds, async) with no derived state."""
    dst = tmp_path / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, dst)
    return dst


def test_a_second_read_derives_nothing_and_answers_the_same(data):
    first = open_runs(data)
    cold = {q: first.query(q) for q in QUERIES}
    assert first.derived.built["cold"] == 2 and set(first.derived.loaded) == {"rounds", "async"}
    second = open_runs(data)
    assert {q: second.query(q) for q in QUERIES} == cold
    assert not second.derived.built and not second.derived.loaded  # read, not derived


@pytest.mark.slow
def test_deleting_the_derived_state_changes_no_answer(data):
    before = answers(data)
    shutil.rmtree(data / "derived")
    assert answers(data) == before
    assert states(data)  # derived again


@pytest.mark.slow
def test_final_views_read_the_same_now_and_at_every_decision(data):
    """A view without a row per evaluation point has the same rows in either state: so a query over
    final rows may read the state at every decision when one is stored."""
    runs = open_runs(data)
    derived = runs.derived
    now, at = derived.state("rounds", NOW), derived.state("rounds", AT_DECISIONS)
    import pyarrow.parquet as pq

    checked = 0
    for view in runs.views:
        if view in runs._at_decisions:
            continue
        a = pq.read_table(derived.view_file(now, view)).to_pylist()
        b = pq.read_table(derived.view_file(at, view)).to_pylist()
        key = lambda row: json.dumps(row, sort_keys=True, default=str)  # noqa: E731
        assert sorted(map(key, a)) == sorted(map(key, b)), view
        checked += 1
    assert checked > 40


@pytest.mark.slow
def test_a_views_stored_rows_read_back_with_its_types(data):
    """Every view's stored rows have the view's column names and types (a 128-bit sum, which Parquet
    cannot hold, as BIGINT: the integer it is, not a DOUBLE)."""
    import duckdb

    runs = open_runs(data)
    con = duckdb.connect()
    for variables in (NOW, AT_DECISIONS):
        state = runs.derived.state("rounds", variables)
        with runs.derived.open("rounds", variables) as catalog:
            for view in runs.views:
                want = [
                    (n, "BIGINT" if str(t) == "HUGEINT" else str(t))
                    for n, t, *_ in catalog.con.execute(f"select * from {view} limit 0").description
                ]
                stored = str(runs.derived.view_file(state, view))
                got = [
                    (n, str(t))
                    for n, t, *_ in con.execute("select * from read_parquet(?) limit 0", [stored]).description
                ]
                assert [c for c in got if c[0] != "run_id" or "run_id" in dict(want)] == want, view


def test_a_run_added_to_the_collection_is_in_the_next_answer(data, runs):
    shutil.rmtree(data / "runs" / "async")
    before = open_runs(data).query("select distinct run_id from trees order by 1")
    assert before == [{"run_id": "rounds"}]
    copy_run(runs, "async", data)
    after = open_runs(data)
    assert after.query("select distinct run_id from trees order by 1") == [{"run_id": "async"}, {"run_id": "rounds"}]
    assert after.derived.built["cold"] == 1 and set(after.derived.loaded) == {"async"}  # only the new run


def _interrupted(data: Path, run_id: str, tmp_path: Path) -> None:
    """An exploration killed (kill -9) after its 12th edge start: a run to resume."""
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEACHER_MCTS_CRASH_AT="edge.started:12")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            str(SNAPSHOTS),
            "--select",
            "--task",
            "kernel-speedup",
            "--num-roots",
            "4",
            "--run-id",
            run_id,
            "--config",
            str(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == -9, done.stderr


@pytest.mark.slow
def test_a_grown_run_is_caught_up_loading_only_its_new_events(data, tmp_path):
    _interrupted(data, "grown", tmp_path)
    log = EventLog(data, "grown")
    runs = open_runs(data, ["grown"])
    before = runs.query("select count(*) as n from events")[0]["n"]
    assert before == log.tail_seq()
    r = CliRunner().invoke(cli, ["--data", str(data), "explore", "--resume", "grown"])  # its summary reads it
    assert r.exit_code == 0, r.output
    grown = log.tail_seq()
    assert grown > before
    resumed = open_runs(data, ["grown"])
    assert resumed.query("select count(*) as n from events")[0]["n"] == grown
    with LogWriter.open(data, "grown") as writer:  # a few events more, appended after the last read
        writer.append([RunResumed(note=f"appended {i}") for i in range(3)])
    again = open_runs(data, ["grown"])
    assert again.query("select count(*) as n from events")[0]["n"] == grown + 3
    assert again.derived.built == {"caught_up": 1}
    assert again.derived.loaded["grown"] == 3  # only the new events were processed
    for flavour in (p for p in (data / "derived" / "grown").iterdir() if p.is_dir()):  # the state replaced is kept
        assert len([p for p in flavour.iterdir() if not p.name.startswith(".tmp-")]) <= 2
    # the states caught up equal one derived from the log alone
    caught_up = {q: again.query(q) for q in QUERIES}
    shutil.rmtree(data / "derived")
    fresh = open_runs(data, ["grown"])
    assert {q: fresh.query(q) for q in QUERIES} == caught_up
    assert fresh.derived.built == {"cold": 1, "reflavoured": 1}  # now, then at decisions from it
    assert replay_run(data, "grown").differences == []
    # A catch-up does not check the recorded config again (its base was stored once the same code
    # had): a reader's process pays no pydantic import for it.
    with LogWriter.open(data, "grown") as writer:
        writer.append([RunResumed(note="appended once more")])
    script = (
        "import sys; from engine.collection import open_runs; r = open_runs(sys.argv[1], ['grown']); "
        "r.query('select count(*) from trees'); print(dict(r.derived.built), 'pydantic' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.split() == ["{'caught_up':", "1}", "False"], done.stdout + done.stderr
    # Nor does a cold read import pandas (pyarrow's Schema.empty_table() did, 0.2 s, for the empty tables).
    shutil.rmtree(data / "derived")
    done = subprocess.run(
        [sys.executable, "-c", script.replace("'pydantic'", "'pandas'"), str(data)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.stdout.split() == ["{'cold':", "1}", "False"], done.stdout + done.stderr


@pytest.mark.slow
def test_a_quarantined_part_rebuilds_that_runs_state(data):
    """The last part damaged in place with its size and time kept (a warm read does not see it:
    DECISIONS), then quarantined: the record changed, so the run is read again from its log."""
    before = answers(data)
    part = EventLog(data, "async").parts()[-1]
    st = part.path.stat()
    raw = bytearray(part.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.path.write_bytes(bytes(raw))
    os.utime(part.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert answers(data) == before  # stored state, keyed by names, sizes and times
    r = CliRunner().invoke(cli, ["--data", str(data), "quarantine", "async", part.path.name])
    assert r.exit_code == 0, r.output
    runs = open_runs(data)
    tail = runs.query("select run_id, max(seq) as tail from events group by 1 order by 1")
    assert tail == [
        {"run_id": "async", "tail": part.first - 1},
        {"run_id": "rounds", "tail": before[QUERIES[3]][1]["tail"]},
    ]
    assert runs.derived.built == {"cold": 1}  # async again, from its log; rounds as stored


def test_a_part_changed_in_place_is_read_again_and_found_damaged(data):
    answers(data)
    part = EventLog(data, "async").parts()[0].path
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.write_bytes(bytes(raw))  # its modification time changes: the state no longer matches
    runs = open_runs(data)
    assert runs.query("select distinct run_id from trees") == [{"run_id": "rounds"}]
    assert [d.run_id for d in runs.damaged] == ["async"]


def test_a_part_renamed_into_place_while_a_state_is_read_where_it_lies_is_listed_again(data, monkeypatch):
    """A stored state's views are derived from the parts read where they lie. A part the writer has
    committed but not yet renamed is listed under its temporary name; the rename can land before
    DuckDB opens it (seen once: audit failed with "Cannot open file .tmp-part-..."). The reader
    lists again and reads it under its name."""
    from ingest.paths import TMP_MARK
    from ingest.reader import EventLog as Reader

    last = EventLog(data, "async").parts()[-1].path
    os.rename(last, last.with_name(TMP_MARK + last.name))  # committed, not yet renamed
    assert open_runs(data, ["async"]).query("select count(*) as n from trees")  # its state, stored then
    listed = Reader.parts
    renamed = []

    def rename_after_listing(self):
        parts = listed(self)
        if not renamed and any(p.path.name.startswith(TMP_MARK) for p in parts):
            os.rename(last.with_name(TMP_MARK + last.name), last)  # the writer's rename, right after the listing
            renamed.append(True)
        return parts

    monkeypatch.setattr(Reader, "parts", rename_after_listing)
    runs = open_runs(data, ["async"])
    rows = runs.query("select stratum, stratum_key, n_eff from coverage order by all")
    assert renamed and rows  # the rename landed while a reader read the parts in place
    assert not runs.derived.built  # the stored state read, its view derived in place
    monkeypatch.undo()
    assert open_runs(data, ["async"]).query("select stratum, stratum_key, n_eff from coverage order by all") == rows


@pytest.mark.slow
def test_edited_view_definitions_rebuild_the_state(data, tmp_path):
    before = answers(data)
    flavours = {p.parent.parent.name for p in states(data)}
    views = tmp_path / "views"
    shutil.copytree(VIEWS_DIR, views)
    trees = views / "trees.sql"
    trees.write_text(trees.read_text().rstrip() + "\n-- edited: the same rows, another definition\n")
    derived = Derived(data, views)
    state = derived.state("rounds", NOW)
    assert derived.built == {"cold": 1} and state.dir.parent.name not in flavours
    # the states the other definitions derived are dropped: no reader of these views reads them
    assert {p.name for p in (data / "derived" / "rounds").iterdir() if p.is_dir()} == {state.dir.parent.name}
    import pyarrow.parquet as pq

    rows = pq.read_table(derived.view_file(state, "trees")).to_pylist()
    query = QUERIES[0]
    assert sorted((r["run_id"], r["tree_id"], r["nodes"], r["kept_edges"], r["stop_reason"]) for r in rows) == [
        tuple(r.values()) for r in before[query] if r["run_id"] == "rounds"
    ]


@pytest.mark.slow
def test_two_processes_reading_a_fresh_collection_at_once_agree_and_leave_it_intact(data):
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from engine.collection import open_runs\n"
        f"queries = {list(QUERIES)!r}\n"
        "runs = open_runs(sys.argv[1])\n"
        "print(json.dumps({q: runs.query(q) for q in queries}, default=str))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1]
    assert json.loads(json.dumps(answers(data), default=str)) == outputs[0]
    for state in states(data):  # every state whole: its files as its digests say, and a tmp directory of neither left
        assert_whole(state.parent)
    assert not list((data / "derived").glob("*/*/.tmp-*"))


@pytest.mark.slow
def test_where_derived_cannot_be_written_a_temporary_directory_serves_with_a_note(data, capsys):
    before = answers(data)
    shutil.rmtree(data / "derived", ignore_errors=True)
    (data / "derived").write_text("not a directory")  # nothing can be stored there
    assert answers(data) == before
    assert "cannot keep derived state in" in capsys.readouterr().err
    assert (data / "derived").read_text() == "not a directory"


@pytest.mark.slow
def test_a_collection_dropped_before_the_interpreter_ends_leaves_a_clean_exit(data):
    """A query's time-limit timer is joined: a timer thread ending during the interpreter's
    finalization dropped the last reference to the connection there, and DuckDB aborted (134)."""
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from engine.audit import audit\n"
        "from engine.collection import open_runs\n"
        "def read():\n"
        "    return open_runs(sys.argv[1]).query('select count(*) as n from trees')[0]['n']\n"
        "print(read(), len(audit(sys.argv[1]).runs))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.split() == ["8", "2"], (done.returncode, done.stdout, done.stderr)


# ------------------------------------------------------------- caught up equals fresh


def _write_prefix(events, data: Path, run_id: str, cuts: list[int]) -> None:
    """Publish ``events`` (a finished run's, by seq) up to each cut in turn, as a writer publishes parts."""
    writer = LogWriter.open(data, run_id) if EventLog(data, run_id).exists() else LogWriter.create(data, run_id)
    with writer:
        for cut in cuts:
            start = writer.tail
            if cut > start:
                writer._pending = [events.slice(start, cut - start)]  # the rows as recorded
                writer.flush()


def _every_view(data: Path) -> dict[str, list]:
    """Every public and audit view (not the staging and intermediate ones: an intermediate table keeps
    a tree's "now" rows at the last seq that concerned it), as the collection reads it: rows sorted,
    floats to 9 significant digits (sums of the same floats in another order)."""
    runs = open_runs(data)

    def norm(value):
        return float(f"{value:.9g}") if isinstance(value, float) else value

    out = {}
    for view in runs.views:
        if view.startswith(("stg_", "int_")):
            continue
        rows = [
            json.dumps({k: norm(v) for k, v in r.items()}, default=str) for r in runs.query(f"select * from {view}")
        ]
        out[view] = sorted(rows)
    return out


@pytest.fixture(scope="module")
def finished(runs):
    """The events of a small finished run (``rounds``), by seq, and the seqs of its last decisions."""
    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    kinds = events.column("kind").to_pylist()
    last = {kind: len(kinds) - kinds[::-1].index(kind) for kind in ("tree_stopped", "paths_selected")}
    return events, last


def _caught_up_equals_fresh(events, tmp_path_factory, earlier: int, later: int) -> None:
    grown = tmp_path_factory.mktemp("grown")
    _write_prefix(events, grown, "rounds", [earlier])
    _every_view(grown)  # states derived at the earlier cut, now and at every decision
    _write_prefix(events, grown, "rounds", [later])
    caught_up = _every_view(grown)
    fresh = tmp_path_factory.mktemp("fresh")
    _write_prefix(events, fresh, "rounds", [later])
    assert caught_up == _every_view(fresh)
    runs = open_runs(grown)
    assert runs.query("select count(*) as n from events")[0]["n"] == later
    assert not runs.derived.built  # (the states read were those caught up)


@pytest.mark.slow
def test_runs_that_grew_are_caught_up_together_and_answer_as_derived_fresh(runs, tmp_path_factory, monkeypatch):
    """Two runs whose trees share their ids (T001...), each grown since its states were stored: caught up in one
    catalog (only the trees their new events concern recomputed), every public and audit view answers as the
    runs derived fresh from their logs."""
    from engine.derived.states import States

    events = {run: EventLog(runs, run).read_table().sort_by("seq") for run in ("rounds", "async")}
    grown, fresh = tmp_path_factory.mktemp("grown"), tmp_path_factory.mktemp("fresh")
    for run, table in events.items():
        _write_prefix(table, grown, run, [table.num_rows * 3 // 5])
    _every_view(grown)  # states derived at the earlier cuts, now and at every decision
    later = {"rounds": events["rounds"].num_rows, "async": events["async"].num_rows * 4 // 5}
    for run, table in events.items():
        _write_prefix(table, grown, run, [later[run]])
        _write_prefix(table, fresh, run, [later[run]])
    together = []  # the runs whose states were stored caught up in a catalog of several runs
    store = States.store

    def stored(self, held, source, variables, views=(), batch=None):
        if held.how == "caught_up" and batch is not None:
            together.append(source.run_id)
        return store(self, held, source, variables, views, batch)

    monkeypatch.setattr(States, "store", stored)
    caught_up = _every_view(grown)
    assert sorted(together) == ["async", "rounds"]  # (at every decision: the final rows read from those states)
    assert caught_up == _every_view(fresh)
    read = open_runs(grown)
    assert read.query("select run_id, count(*) as n from events group by all order by run_id") == [
        {"run_id": "async", "n": later["async"]},
        {"run_id": "rounds", "n": later["rounds"]},
    ]
    assert not read.derived.built  # (the states read were those caught up)


@pytest.mark.parametrize(
    ("before", "upto"), [("tree_stopped", "end"), ("paths_selected", "end"), ("paths_selected", "paths_selected")]
)
@pytest.mark.slow
def test_a_state_caught_up_across_the_last_decisions_audits_as_one_derived_there(
    finished, tmp_path_factory, before, upto
):
    """Finding: a stored state caught up across the run's last TreeStopped and PathsSelected decisions gave
    178 false audit violations on README's run: at every decision, a decision is a point of its tree (a
    path selection: of every tree), which the catch-up did not recompute."""
    events, last = finished
    _caught_up_equals_fresh(events, tmp_path_factory, last[before] - 1, last.get(upto, events.num_rows))


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_state_caught_up_across_a_cut_answers_as_one_derived_fresh_there(finished, tmp_path_factory, data):
    """For random cut points of a finished run's log, a state caught up from the earlier cut answers every
    public and audit view as a state derived fresh at the later one."""
    events, _last = finished
    earlier = data.draw(st.integers(40, events.num_rows - 1), label="earlier cut")
    later = data.draw(st.integers(earlier + 1, events.num_rows), label="later cut")
    _caught_up_equals_fresh(events, tmp_path_factory, earlier, later)


@pytest.mark.slow
def test_a_still_collection_reads_a_view_of_every_run_from_one_checked_file(data, monkeypatch, capsys):
    """engine/derived/combined.py: while the runs' files are new (a live collection) each query reads
    them; once they are still, one file of each small view's rows of every run, read instead, equal
    to them, checked as every stored file; a run that grew names another; a refused write is no error."""
    import duckdb

    import engine.derived.combined as combined

    monkeypatch.setattr(combined, "STILL_SECONDS", 3600.0)
    live = answers(data)
    made = data / "derived" / combined.COMBINED
    assert not made.exists()  # files just written: not still
    monkeypatch.setattr(combined, "STILL_SECONDS", 0.0)
    monkeypatch.setattr(combined, "SMALL_FILE", 0)  # no file is that small: none is made
    assert answers(data) == live and not made.exists()
    monkeypatch.undo()
    monkeypatch.setattr(combined, "STILL_SECONDS", 0.0)
    assert answers(data) == live
    files = {p.parent.parent.name: p for p in made.glob("*/*/*.parquet")}
    assert set(files) == {"trees", "paths", "coverage", "events", "audit_node_selected"}  # the views read
    runs = open_runs(data)
    for view, path in files.items():  # each holds exactly the runs' own rows of the view
        per_run = [str(f) for f in sorted((data / "derived").glob(f"*/*/*/views/{view}-*.parquet"))]
        each = duckdb.sql(f"select * from read_parquet({per_run}) order by all").fetchall()
        assert duckdb.sql(f"select * from read_parquet('{path}') order by all").fetchall() == each
        assert runs._view_files({view})[view] == (str(path),)  # and is the file a query reads
        own = runs._view_files({view}, ("rounds",))[view]  # a run's query: its own file
        assert len(own) == 1 and "/rounds/" in own[0] and own != (str(path),)
    # damaged: dropped with a note, made again, the same answers
    raw = bytearray(files["coverage"].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    files["coverage"].write_bytes(bytes(raw))
    capsys.readouterr()
    assert answers(data) == live
    assert f"{files['coverage']} dropped (" in capsys.readouterr().err and files["coverage"].exists()
    # a run that grew: its rows from another file, the one before kept beside it
    with LogWriter.open(data, "async") as writer:
        writer.append([RunResumed(note="appended")])
    grown = answers(data)
    events = grown[QUERIES[3]]
    assert [r["n"] for r in events] == [r["n"] + (r["run_id"] == "async") for r in live[QUERIES[3]]]
    assert len(list((made / "events").iterdir())) == 2
    # another collection (the runs named in another order: other files, another key) keeps its
    # own file beside the two of every run's, none replaced
    assert open_runs(data, ["rounds", "async"]).query(QUERIES[0]) == grown[QUERIES[0]]
    assert len(list((made / "trees").iterdir())) == 3
    fresh = data.parent / "fresh"
    shutil.copytree(data, fresh, ignore=shutil.ignore_patterns("derived"))
    assert answers(fresh) == grown  # as derived from the log alone
    # derived/ refusing the write: the runs' files are read, and no error
    shutil.rmtree(made)
    made.write_text("not a directory")
    assert answers(data) == grown


@pytest.mark.slow
def test_runs_derived_together_store_what_each_run_derived_alone_stores(data, tmp_path, monkeypatch):
    """Four runs on two cores: two catalogs of two runs, built at once; each run's state is its own alone."""
    import os

    import pyarrow.parquet as pq

    from engine.derived.batch import derive_together
    from engine.derived.catalogs import Catalogs

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    made = []
    new = Catalogs.new
    monkeypatch.setattr(Catalogs, "new", lambda self: made.append(1) or new(self))
    runs = {"rounds": "rounds", "async": "async", "rounds2": "rounds", "async2": "async"}
    for variables in (NOW, AT_DECISIONS):  # (each on runs with nothing stored: a state of one is the other's base)
        alone, here = (tmp_path / f"{way}-{variables['asof_points']}" for way in ("alone", "together"))
        for run, source in runs.items():
            copy_run(data, source, alone, run)
            copy_run(data, source, here, run)
        together = Derived(here)
        views = ("trees", "top_paths", "coverage_strata")  # (the last one's rows are no run's: constants)
        made.clear()
        assert derive_together(together, together.catalogs, list(runs), variables, views) == list(runs)
        assert len(made) == 2  # a catalog a core
        assert derive_together(together, together.catalogs, list(runs), variables) == []  # (nothing cold left)
        for run in runs:
            mine, theirs = together.find(run, variables), Derived(alone).state(run, variables, views=views)
            assert mine is not None and (mine.values, mine.explicit) == (theirs.values, theirs.explicit)
            assert_whole(mine.dir)
            files = [(t, p, theirs.table_files()[t]) for t, p in mine.table_files().items()]
            files += [(v, *(next((s.dir / "views").glob(f"{v}-*.parquet")) for s in (mine, theirs))) for v in views]
            assert len(files) == len(mine.table_files()) + 3
            for name, path, other in files:
                got = pq.read_table(path).to_pylist()
                assert got and {r["run_id"] for r in got} <= {run}
                want = pq.read_table(other).to_pylist()
                assert sorted(map(repr, got)) == sorted(map(repr, want)), f"{run}: {name}"


@pytest.fixture
def evaluated(monkeypatch) -> list[str]:
    """The views evaluated in one run's catalog (``Derived._derive_view``, which still runs), in order."""
    seen: list[str] = []
    derive_view = Derived._derive_view
    monkeypatch.setattr(
        Derived,
        "_derive_view",
        lambda self, state, view, held=None: seen.append(view) or derive_view(self, state, view, held),
    )
    return seen


def test_a_cold_query_reads_the_rows_its_runs_were_derived_with_together(data, evaluated):
    # no view is evaluated for one run's state: the batch wrote every run's rows
    reader = open_runs(data)
    got = reader.query(QUERIES[0])
    assert reader.derived.built == {"cold": 2} and evaluated == []
    assert {r["run_id"] for r in got} == {"rounds", "async"}
    shutil.rmtree(data / "derived")
    assert [r for run in ("async", "rounds") for r in open_runs(data, [run]).query(QUERIES[0])] == got
    assert evaluated == ["trees", "trees"]  # (a run alone: its view's rows from its own catalog)


def test_a_cold_audit_derives_its_runs_once_with_every_view_it_reads(data, evaluated, monkeypatch):
    from engine.audit import audit

    cold = audit(data)
    assert evaluated == []  # (every view it reads was written as its runs were derived)
    shutil.rmtree(data / "derived")
    monkeypatch.undo()
    for run in ("rounds", "async"):  # what each run audited alone gives
        alone = audit(data, [run])
        assert [r for r in cold.violations if r["run_id"] == run] == alone.violations
        assert [r for r in cold.coverage if r["run_id"] == run] == alone.coverage


def test_a_view_first_read_over_stored_states_is_evaluated_once_for_their_runs(data, evaluated):
    open_runs(data).query(QUERIES[4])  # the runs' states stored (at every decision), with an audit view's rows
    # no view is evaluated in one run's catalog: one catalog held both states
    reader = open_runs(data)
    got = {q: reader.query(q) for q in QUERIES[:3]}  # (trees, paths, coverage: read first here)
    assert not reader.derived.built and evaluated == []
    shutil.rmtree(data / "derived")
    for q, rows in got.items():  # what each run read alone gives
        assert [r for run in ("async", "rounds") for r in open_runs(data, [run]).query(q)] == rows
    assert sorted(evaluated) == sorted(["trees", "paths", "coverage"] * 2)  # (a run alone: its own catalog)


def test_runs_whose_configs_set_different_defaults_are_not_derived_together(data):
    from engine.derived.batch import derive_together

    copy_with_other_knowledge(data, "async", "other")
    derived = Derived(data)
    assert (
        derive_together(derived, derived.catalogs, ["rounds", "other"], NOW) == []
    )  # one value of a variable serves a catalog
    assert not derived.built and not (data / "derived" / "other").exists()
    assert derive_together(derived, derived.catalogs, ["rounds", "async", "other"], NOW) == []
