"""A live run's derived state kept current by its writer (engine/derived/live.py): a reader of a run
being written finds the state of what the writer published, equal to one derived fresh from the log."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import ROOT, copy_run
from test_derived import QUERIES, _every_view, _write_prefix, answers
from test_watch import start_endless

from engine.catalog import DECISION_THREADS, Catalog
from engine.collection import open_runs
from engine.derived import NOW, Derived
from engine.derived.files import dump_json, load_json
from engine.derived.live import MAX_LAG, Keeper
from ingest.log import EventLog, LogWriter


def _live_writer(events, data: Path, run_id: str, cuts: list[int], keeper: Keeper, read, whole=(), between=None):
    """Publish ``events`` up to each cut as the engine does (staged into its catalog, flushed, the keeper told),
    calling ``read(cut)`` after each; the cuts ``whole`` as the parts a run must publish whole (its last),
    calling ``between(cut)`` once the part is published, before its state is kept."""
    catalog = Catalog.empty(threads=DECISION_THREADS)
    with LogWriter.create(data, run_id) as writer:
        for cut in cuts:
            rows = events.slice(writer.tail, cut - writer.tail)
            writer._pending = [rows]  # staged: the rows as recorded
            catalog.insert(rows)
            keeper.publishing(cut in whole)
            writer.flush()
            if between is not None:
                between(cut)
            keeper.published(catalog, force=cut in whole)
            read(cut)
    keeper.close()
    catalog.close()


@pytest.mark.slow
def test_a_reader_of_a_live_run_reads_what_its_writer_kept_and_loads_no_event(runs, tmp_path):
    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    n = events.num_rows
    cuts = [n // 5, 2 * n // 5, 3 * n // 5, 4 * n // 5, n]
    live = tmp_path / "live"
    keeper = Keeper(live, "rounds", budget=1e9)  # (a state at every part a reader is waiting for)
    seen = []

    def read(cut: int) -> None:
        reader = open_runs(live)
        held = reader.query("select count(*) as n from events")[0]["n"]
        views = _every_view(live)
        fresh = tmp_path / f"fresh-{cut}"
        _write_prefix(events, fresh, "rounds", [cut])
        assert views == _every_view(fresh)  # what the writer kept answers as a fresh derivation there
        seen.append((cut, held, dict(reader.derived.built), sum(reader.derived.loaded.values())))

    _live_writer(events, live, "rounds", cuts, keeper, read)
    assert [(cut, held) for cut, held, *_ in seen] == [(c, c) for c in cuts]
    # the first read finds nothing kept (no reader had read the run when it was published); from then on
    # every part is kept by the writer as it is published, and a reader derives nothing and loads no event
    assert seen[0][2] == {"cold": 1}
    assert all(not built and not loaded for _cut, _held, built, loaded in seen[1:]), seen
    assert keeper.kept == len(cuts) - 1


@pytest.mark.slow
def test_a_part_readers_must_see_is_never_read_as_the_state_kept_before_it(runs, tmp_path):
    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    n = events.num_rows
    live = tmp_path / "live"
    keeper = Keeper(live, "rounds", budget=1e9)

    def between(cut: int) -> None:  # a reader after a part's publication, before its state: the run as published
        reader = open_runs(live)
        assert reader.query("select count(*) as n from events")[0]["n"] == cut
        assert reader.query("select finished from run_pace")[0]["finished"] is (cut == n)

    _live_writer(events, live, "rounds", [n // 2, n], keeper, lambda cut: None, whole=[n], between=between)
    assert keeper.kept == 2  # (each part's state kept: the first one what the reader of the last could read)


@pytest.mark.slow
def test_a_run_nobody_reads_keeps_one_state_at_its_end_and_its_first_reader_derives_nothing(runs, tmp_path):
    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    n = events.num_rows
    written = tmp_path / "written"
    keeper = Keeper(written, "rounds", budget=1e9)
    _live_writer(events, written, "rounds", [n // 2, n], keeper, lambda cut: None)
    assert keeper.kept == 0  # no reader: nothing kept between the parts
    catalog = Catalog.for_log(EventLog(written, "rounds"), threads=DECISION_THREADS)
    Keeper(written, "rounds").published(catalog, force=True)  # the run's last part (as the engine's finish)
    reader = open_runs(written)
    before = {q: reader.query(q) for q in QUERIES[:4]}
    assert not reader.derived.built and not reader.derived.loaded
    shutil.rmtree(written / "derived")
    assert {q: open_runs(written).query(q) for q in QUERIES[:4]} == before


@pytest.mark.slow
def test_an_exploration_read_while_it_runs_is_read_from_the_states_its_writer_keeps(tmp_path):
    data = tmp_path / "data"
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        writer = start_endless(data, "live", err)
    try:
        deadline = time.monotonic() + 600
        held = 0
        found = None
        while found is None and time.monotonic() < deadline:
            if not EventLog(data, "live").exists():
                time.sleep(0.05)
                continue
            reader = open_runs(data, ["live"])
            n = reader.query("select count(*) as n from events")[0]["n"]
            if n > held and held and not reader.derived.built and not reader.derived.loaded:
                found = (held, n)  # the run grew since the last read, and this read derived nothing
            held = n
            time.sleep(0.2)
        assert found is not None, "no read found a state its writer kept"
    finally:
        writer.send_signal(signal.SIGINT)
        writer.wait(timeout=300)
    # Ctrl-C's message ends with the command that continues the run (its first line scrolled away)
    assert writer.returncode == 130
    assert stderr.read_text().splitlines()[-2:] == [
        f"continue with: python {ROOT / 'cli.py'} --data {data} explore --resume live",  # as the writer was run
        "Interrupted.",
    ]
    # what was kept answers as the log does
    kept = answers(data)
    shutil.rmtree(data / "derived")
    assert answers(data) == kept


@pytest.mark.slow
def test_states_of_other_view_definitions_are_derived_again_run_by_run(runs, tmp_path):
    from engine.catalog.definitions import VIEWS_DIR

    data = tmp_path / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)
    views = tmp_path / "views"
    shutil.copytree(VIEWS_DIR, views)
    (views / "trees.sql").write_text((views / "trees.sql").read_text() + "\n-- another version of the views\n")
    Derived(data, views).state("rounds", NOW)  # "rounds" read by a reader of other views
    Derived(data).state("async", NOW)  # "async" by one of these
    reader = open_runs(data)
    got = {q: reader.query(q) for q in QUERIES[:4]}
    assert reader.derived.built == {"cold": 1} and set(reader.derived.loaded) == {"rounds"}
    shutil.rmtree(data / "derived")
    assert {q: open_runs(data).query(q) for q in QUERIES[:4]} == got


@pytest.mark.slow
def test_a_live_run_is_read_as_of_its_writers_last_state_and_as_its_log_once_the_writer_is_gone(runs, tmp_path):
    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    n = events.num_rows
    data = tmp_path / "data"
    keeper = Keeper(data, "rounds", budget=1e9)
    catalog = Catalog.empty(threads=DECISION_THREADS)
    count = "select count(*) as n from events"
    with LogWriter.create(data, "rounds") as writer:

        def publish(cut: int, keep: bool) -> None:
            rows = events.slice(writer.tail, cut - writer.tail)
            writer._pending = [rows]  # staged: the rows as recorded
            catalog.insert(rows)
            writer.flush()
            if keep:
                keeper.published(catalog)

        publish(n // 3, keep=True)
        assert open_runs(data).query(count) == [{"n": n // 3}]  # (a reader: the writer keeps from now on)
        before = time.time_ns()
        publish(n // 2, keep=True)
        mark = data / "derived" / "rounds" / "keeper.json"
        held = load_json(mark, "rounds/keeper.json")
        assert held["until"] > before  # read as of it for a while after it was kept
        # (held for most of a minute, as by a writer whose next state is that far: the reads below
        # come within it on any machine; the writer's own bound is a second past its next chance)
        held["until"] = time.time_ns() + int((MAX_LAG - 1) * 1e9)
        mark.write_text(dump_json("rounds/keeper.json", held))
        publish(2 * n // 3, keep=False)  # published; its state not kept yet (a reader comes first)
        reader = open_runs(data)
        assert reader.query(count) == [{"n": n // 2}]  # as of the writer's last state: nothing derived
        assert not reader.derived.built and not reader.derived.loaded
        trees = "select tree_id, nodes, kept_edges from trees order by tree_id"
        _write_prefix(events, tmp_path / "half", "rounds", [n // 2])
        assert reader.query(trees) == open_runs(tmp_path / "half").query(trees)
        # the writer had the time to keep a later state and did not (nobody read, or its budget): from the log
        mark.write_text(dump_json("rounds/keeper.json", held | {"until": time.time_ns() - 1}))
        reader = open_runs(data)
        assert reader.query(count) == [{"n": 2 * n // 3}] and reader.derived.built == {"caught_up": 1}
        publish(5 * n // 6, keep=False)
        mark.write_text(dump_json("rounds/keeper.json", held))  # (as it was: of n // 2, readable still)
        keeper.close()  # the writer is gone: the run is read as its log is now
        assert not mark.exists()
        reader = open_runs(data)
        assert reader.query(count) == [{"n": 5 * n // 6}] and reader.derived.built == {"caught_up": 1}
    catalog.close()


@pytest.mark.parametrize("who", ["killed", "alive, not the writer", "the writer, its mark forged"])
def test_a_mark_is_read_only_while_its_process_writes_the_run_and_within_its_bound(runs, tmp_path, who):
    """A killed writer's mark, or a mark (forged or left) naming a live process that does not hold the run's
    writer lock, or one whose time runs far ahead: the run is read as its log is."""
    import subprocess
    import sys

    events = EventLog(runs, "rounds").read_table().sort_by("seq")
    n = events.num_rows
    data = tmp_path / "data"
    keeper = Keeper(data, "rounds", budget=1e9)
    _live_writer(events, data, "rounds", [n // 3], keeper, lambda cut: open_runs(data).query("select 1"))
    keeper.published(Catalog.for_log(EventLog(data, "rounds"), threads=DECISION_THREADS), force=True)
    mark = data / "derived" / "rounds" / "keeper.json"
    body = load_json(mark, "rounds/keeper.json")
    day = 86_400 * 10**9
    body["until"] = time.time_ns() + int((MAX_LAG - 1) * 1e9)  # (within the bound: the pid is what is checked)
    with LogWriter.open(data, "rounds") as writer:  # the run grows, written by this process
        rows = events.slice(writer.tail, n // 2 - writer.tail)
        writer._pending = [rows]  # staged: the rows as recorded
        writer.flush()
        if who == "killed":
            gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
            body |= {"pid": int(gone.stdout)}
        elif who == "alive, not the writer":
            body |= {"pid": os.getppid()}
        else:
            body |= {"pid": os.getpid(), "until": time.time_ns() + day}
        mark.write_text(dump_json("rounds/keeper.json", body))
        reader = open_runs(data)
        assert reader.query("select count(*) as n from events") == [{"n": n // 2}]
        assert reader.derived.built == {"caught_up": 1}
