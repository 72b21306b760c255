"""Stored derived state changed behind the readers' backs: every answer is still the log's.

Each kind of stored file (a view's rows, a materialized table's rows, ``state.json``, the
source cache) is changed in place - a value rewritten in a whole, valid file, or the file
truncated, replaced by garbage, removed - and every reader (``sql``, the notebook API,
``report``, ``export``, ``paths``, ``reselect``, ``audit``, ``watch``, ``serve``) must
answer exactly as it does with ``derived/`` deleted, say what it dropped, and leave the
log byte-identical. A writer's decision (``reselect``, ``explore --resume``) must equal
the fresh derivation's even when the digests are rewritten to match the forgery.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from conftest import ROOT, SMALL, SNAPSHOTS, copy_run

from cli import cli
from engine.collection import open_runs
from engine.derived.files import dump_json, file_digest, load_json, split_name

RUN = "rounds"
SELECT = ("select run_id, tree_id, best_score, kept_edges, top_path_score from trees order by all",)


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


def log_bytes(data: Path) -> dict[str, str]:
    """Every file of the runs' directories (their logs), by its SHA-256."""
    root = data / "runs"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


# ---------------------------------------------------------------- the tampering


def _rewrite_parquet(path: Path, sql: str) -> None:
    """Rewrite a Parquet file in place (same name) with ``sql`` over its rows (``t``): valid, different."""
    con = duckdb.connect()
    con.execute(f"create table t as select * from read_parquet('{path}')")
    tmp = path.with_name("tampered.tmp")
    con.execute(f"copy ({sql}) to '{tmp}' (format parquet)")
    os.replace(tmp, path)


def _files(data: Path, pattern: str) -> list[Path]:
    found = sorted((data / "derived").glob(pattern))
    assert found, f"no stored file {pattern} to tamper with"
    return found


def forged_value_of_a_view(data: Path) -> None:
    """Finding 1: a tree's best_score rewritten in the stored rows of ``trees``."""
    for path in _files(data, "*/*/*/views/trees-*.parquet"):
        _rewrite_parquet(path, "select * replace (best_score + 1000 as best_score) from t")


def forged_value_of_a_table(data: Path) -> None:
    """Finding 2: every path's avg_cleanliness rewritten in the stored rows of ``int_paths__measured``."""
    for path in _files(data, "*/*/*/tables/int_paths__measured-*.parquet"):
        _rewrite_parquet(path, "select * replace (1 - avg_cleanliness as avg_cleanliness) from t")
    for path in _files(data, "*/*/*/tables/paths-*.parquet"):
        _rewrite_parquet(path, "select * replace (-path_score as path_score) from t")


def truncated_view(data: Path) -> None:
    """Finding 4: a view's file cut short."""
    for path in _files(data, "*/*/*/views/*.parquet"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage_table(data: Path) -> None:
    """Finding 4: a table's file replaced by bytes that are not Parquet; another one removed."""
    for path in _files(data, "*/*/*/tables/int_nodes__created-*.parquet"):
        path.write_bytes(b"not parquet at all" * 100)
    for path in _files(data, "*/*/*/tables/int_turns-*.parquet"):
        path.unlink()


def forged_state_document(data: Path) -> None:
    """state.json with other variable values (the PathScore weights) and its tables swapped."""
    for path in _files(data, "*/*/*/state.json"):
        held = json.loads(path.read_text())
        held["values"] = {k: (0.97 if k.startswith("w_path") else v) for k, v in held["values"].items()}
        held["tables"]["paths"], held["tables"]["int_paths__measured"] = (
            held["tables"]["int_paths__measured"],
            held["tables"]["paths"],
        )
        path.write_text(json.dumps(held))


def truncated_state_document(data: Path) -> None:
    for path in _files(data, "*/*/*/state.json"):
        path.write_text(path.read_text()[:100])


def forged_source_cache(data: Path) -> None:
    """The source cache claiming an earlier tail and fewer parts (a stale state would then match)."""
    for path in _files(data, "*/source.json"):
        held = json.loads(path.read_text())
        held["source"]["tail"] = held["source"]["tail"] // 2
        held["source"]["parts"] = held["source"]["parts"][:1]
        path.write_text(json.dumps(held))


def states_of_two_runs_swapped(data: Path) -> None:
    """Each run's derived directory renamed to the other's."""
    a, b = data / "derived" / RUN, data / "derived" / "other"
    a.rename(data / "derived" / "swap")
    b.rename(a)
    (data / "derived" / "swap").rename(b)


@contextlib.contextmanager
def another_users_key(where: Path):
    """Everything in the block keyed by another user's key (a file of its own under ``where``)."""
    key = where / "another-user.key"
    if not key.exists():
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
    mine = os.environ.get("TEACHER_MCTS_KEY")
    os.environ["TEACHER_MCTS_KEY"] = str(key)
    try:
        yield
    finally:
        if mine is None:
            del os.environ["TEACHER_MCTS_KEY"]
        else:
            os.environ["TEACHER_MCTS_KEY"] = mine


def forged_by_another_user(data: Path) -> None:
    """Issue 52: every stored file made by another user (a data directory copied from a colleague), then
    forged - a view's and the tables' values rewritten - with every digest and check recomputed as the code
    computes them, under that user's key: nothing but the key tells it from this user's own."""
    shutil.rmtree(data / "derived")
    with another_users_key(data.parent):
        for reader in (read_sql, read_audit, read_paths, read_notebook):
            reader(data, data.parent)
        forge_with_digests(data)
        for path in _files(data, "*/*/*/views/trees-*.parquet"):
            relative = "/".join(path.parent.parent.parts[-3:])
            _rewrite_parquet(path, "select * replace (best_score + 1000 as best_score) from t")
            path.rename(path.with_name(f"trees-{file_digest(relative, 'trees', path.read_bytes())}.parquet"))


TAMPERS = [
    forged_value_of_a_view,
    forged_value_of_a_table,
    truncated_view,
    garbage_table,
    forged_state_document,
    truncated_state_document,
    forged_source_cache,
    states_of_two_runs_swapped,
    forged_by_another_user,
]


# ------------------------------------------------------------------ the readers


def read_sql(data: Path, _tmp: Path) -> str:
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0, r.output
    return r.stdout


def read_notebook(data: Path, _tmp: Path) -> str:
    runs = open_runs(data)
    frames = [runs.sql(q).to_dicts() for q in (*SELECT, "select * from paths order by all")]
    trees = sorted(json.dumps(r, default=str, sort_keys=True) for r in runs.trees.to_dicts())  # (no order asked)
    return json.dumps([*frames, trees], default=str)


def read_report(data: Path, tmp: Path) -> str:
    out = tmp / "report.html"
    r = invoke(data, "report", "--out", str(out))
    assert r.exit_code == 0, r.output
    return out.read_text()


def read_export(data: Path, tmp: Path) -> str:
    out = tmp / "export"
    r = invoke(data, "export", RUN, "--out", str(out))
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    return json.dumps([manifest["counts"], (out / f"{RUN}.chat.jsonl").read_text()])


def read_paths(data: Path, _tmp: Path) -> str:
    r = invoke(data, "paths", RUN, "--json")
    assert r.exit_code == 0, r.output
    return r.stdout


def read_audit(data: Path, _tmp: Path) -> str:
    r = invoke(data, "audit", "--json")
    assert r.exit_code == 0, r.output
    return r.stdout


def read_watch(data: Path, _tmp: Path) -> str:
    r = invoke(data, "watch", RUN, "--once")
    assert r.exit_code == 0, r.output
    return re.sub(r"\d+(\.\d+)? ?(s|min|h) ago|age \S+", "", r.stdout)  # (ages move on)


def read_reselect(data: Path, _tmp: Path) -> str:
    """The selection reselect records (it appends to the log: the answer is the decision recorded)."""
    r = invoke(data, "reselect", RUN, "--weights", "max=0.2,avg=0.5,clean=0.2,know=0.1", "--top-k", "2", "--json")
    assert r.exit_code == 0, r.output
    document = json.loads(r.stdout)
    assert document["appended"]
    return json.dumps(document, sort_keys=True)


def read_serve(data: Path, tmp: Path) -> str:
    """The pages of a real ``serve`` process: a tree, a path's conversation, a query."""
    from test_web import serving

    pages = []
    with serving(data, tmp) as (base, token):
        headers = {"Authorization": f"token {token}"} if token else {}
        for path in (f"/run/{RUN}/tree/T001", "/"):
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=300) as resp:
                pages.append(resp.read().decode())
    return re.sub(re.escape(str(data)), "DATA", "\n".join(pages))


READERS = [
    read_sql,
    read_notebook,
    read_report,
    read_export,
    read_paths,
    read_audit,
    read_watch,
    read_reselect,
    read_serve,
]


# ------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def warm(runs, tmp_path_factory) -> Path:
    """Two finished runs, every kind of stored file derived (both flavours, views read, the source cache)."""
    data = tmp_path_factory.mktemp("warm") / "data"
    copy_run(runs, RUN, data)
    copy_run(runs, "async", data, "other")
    for reader in (read_sql, read_audit, read_paths, read_notebook):
        reader(data, tmp_path_factory.mktemp("out"))
    assert list((data / "derived").glob(f"{RUN}/*/*/tables/*.parquet"))
    return data


@pytest.fixture(scope="module")
def fresh(warm, tmp_path_factory) -> dict[str, str]:
    """What each reader answers from the log alone (no derived state at all), each on its own copy."""
    out = {}
    for reader in READERS:
        data = tmp_path_factory.mktemp("fresh") / "data"
        shutil.copytree(warm / "runs", data / "runs")
        out[reader.__name__] = reader(data, tmp_path_factory.mktemp("out"))
    return out


def _copy(warm: Path, tmp: Path) -> Path:
    data = tmp / "data"
    shutil.copytree(warm, data)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda f: f.__name__)
def test_every_reader_answers_as_the_log_whatever_stored_file_was_changed(warm, fresh, tmp_path, capfd, tamper):
    for reader in READERS:
        data = _copy(warm, tmp_path / reader.__name__)
        before = log_bytes(data)
        tamper(data)
        answer = reader(data, tmp_path / reader.__name__)
        assert answer == fresh[reader.__name__], f"{reader.__name__} after {tamper.__name__}"
        after = log_bytes(data)
        if reader is read_reselect:  # it appends its decision: the log before it is unchanged
            assert all(after[k] == v for k, v in before.items() if not k.endswith("_record.jsonl"))
        else:
            assert after == before, reader.__name__


def test_a_changed_view_file_is_dropped_and_the_answer_is_the_logs(warm, fresh, tmp_path):
    """Finding 1, fast tier: the forged best_score is never served; one line says what was dropped."""
    data = _copy(warm, tmp_path)
    forged_value_of_a_view(data)
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0 and r.stdout == fresh["read_sql"], r.output
    assert re.search(r"note: derived state .*trees-[0-9a-f]{32}\.parquet dropped \(.*digest", r.stderr), r.stderr
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.stdout == fresh["read_sql"] and "dropped" not in r.stderr  # healed: read stored next time


def test_a_changed_table_file_never_reaches_a_recorded_selection_or_an_export(warm, fresh, tmp_path):
    """Findings 2 and 3, fast tier: a stored table edited never forges reselect's decision, and an
    export's paths and samples are the log's."""
    data = _copy(warm, tmp_path)
    forged_value_of_a_table(data)
    assert read_reselect(data, tmp_path) == fresh["read_reselect"]
    forged_value_of_a_table(data)
    assert read_export(data, tmp_path) == fresh["read_export"]
    forged_value_of_a_table(data)
    r = invoke(data, "paths", RUN, "--json")
    assert r.stdout == fresh["read_paths"] and "dropped" in r.stderr, r.output


# ------------------------------------------------- forgeries with their digests rewritten


def forge_with_digests(data: Path) -> int:
    """Rewrite every stored table's rows of int_paths__measured and paths (a forged PathScore), and give
    the files the names their digests now have and state.json its new check: nothing a reader checks
    can tell. Returns the number of states forged."""
    forged = 0
    for state in sorted((data / "derived").glob("*/*/*/state.json")):
        relative = "/".join(state.parent.parts[-3:])
        held = load_json(state, relative)
        for table, sql in (
            ("int_paths__measured", "select * replace (1 - avg_cleanliness as avg_cleanliness) from t"),
            ("paths", "select * replace (-path_score as path_score) from t"),
        ):
            path = state.parent / "tables" / held["tables"][table]
            _rewrite_parquet(path, sql)
            stem = split_name(path.name)[0]
            name = f"{stem}-{file_digest(relative, stem, path.read_bytes())}.parquet"
            path.rename(path.with_name(name))
            held["tables"][table] = name
        state.write_text(dump_json(relative, held))
        forged += 1
    return forged


def test_reselect_records_the_fresh_selection_from_a_forgery_whose_digests_match(warm, fresh, tmp_path):
    data = _copy(warm, tmp_path)
    assert forge_with_digests(data) >= 2
    assert read_reselect(data, tmp_path) == fresh["read_reselect"]


def _explore_killed(data: Path, tmp: Path) -> None:
    """An exploration killed (kill -9) after its 12th edge start."""
    config = tmp / "small.toml"
    config.write_text(SMALL)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEACHER_MCTS_CRASH_AT="edge.started:12")
    args = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "explore", str(SNAPSHOTS), "--select"]
    args += ["--task", "kernel-speedup", "--num-roots", "4", "--run-id", "killed", "--schedule", "rounds"]
    done = subprocess.run([*args, "--config", str(config)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == -9, done.stderr


def _decisions(data: Path, run_id: str) -> list:
    from ingest.events import DECISION_KINDS
    from ingest.log import EventLog

    table = EventLog(data, run_id).read_table().sort_by("seq")
    keep = [c for c in table.column_names if c not in ("recorded_at", "run_id")]
    rows = table.select(keep).to_pylist()
    return [
        {k: v for k, v in r.items() if v is not None}
        for r in rows
        if r["kind"] in DECISION_KINDS and r["kind"] != "snapshots_picked"
    ]


@pytest.mark.slow
def test_a_resumed_exploration_decides_as_the_log_says_whatever_derived_holds(tmp_path):
    """explore --resume reads nothing stored: a forged state (digests rewritten) beside the killed run
    changes none of the decisions its resumption records."""
    clean = tmp_path / "clean" / "data"
    _explore_killed(clean, tmp_path)
    forged = tmp_path / "forged" / "data"
    shutil.copytree(clean, forged)
    assert invoke(forged, "sql", "killed", "select count(*) from trees").exit_code == 0  # states derived
    assert invoke(forged, "audit", "killed").exit_code in (0, 1)
    assert forge_with_digests(forged) >= 1
    for data in (clean, forged):
        r = invoke(data, "explore", "--resume", "killed")
        assert r.exit_code == 0, r.output
    assert _decisions(forged, "killed") == _decisions(clean, "killed")


def test_a_source_cache_for_another_run_is_not_used(warm, tmp_path, capfd):
    data = _copy(warm, tmp_path)
    shutil.copy(data / "derived" / "other" / "source.json", data / "derived" / RUN / "source.json")
    assert open_runs(data).query("select count(*) as n from events where run_id = 'rounds'")[0]["n"] > 0
    assert "source.json dropped" in capfd.readouterr().err


@pytest.mark.parametrize("point", ["derived.written:3", "derived.built:1"])
def test_a_reader_killed_while_writing_leaves_nothing_a_later_reader_trusts(warm, fresh, tmp_path, point):
    """A table's or a view's file cut off before its rename, or a whole state before its directory's
    (kill -9): what is left is temporary, and the next reader answers as the log."""
    data = _copy(warm, tmp_path)
    shutil.rmtree(data / "derived")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEACHER_MCTS_CRASH_AT=point)
    args = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "sql", *SELECT]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == -9, done.stderr
    left = [p for p in (data / "derived").rglob("*") if ".tmp-" in p.name]
    assert left, "the kill left no temporary file: it did not land mid-write"
    assert not [p for p in (data / "derived").glob("*/*/*/state.json") if ".tmp-" not in str(p)]
    assert read_sql(data, tmp_path) == fresh["read_sql"]


def test_verify_names_each_damaged_state_and_what_a_read_does_with_it(warm, tmp_path):
    data = _copy(warm, tmp_path)
    r = invoke(data, "verify", RUN)
    assert r.exit_code == 0 and f"derived state of run {RUN}: 2 stored (2 of the log as it is now)" in r.stdout
    assert "every file as its digest records" in r.stdout
    forged_value_of_a_view(data)
    r = invoke(data, "verify", RUN)
    assert r.exit_code == 0, r.output  # the log is whole: a read heals the state
    assert r.stdout.splitlines()[-1].startswith("verify: "), r.stdout  # (the log's verdict stays last)
    assert (
        "2 stored (2 of the log as it is now); 1 damaged or not made by this user - the next read drops each and "
        "derives it again"
    ) in r.stdout
    assert len(re.findall(r"DAMAGED  \S+/derived/rounds/\S+: trees-[0-9a-f]{32}\.parquet does not hold", r.stdout)) == 1
    document = json.loads(invoke(data, "verify", RUN, "--json").stdout)
    assert sorted(bool(d["problems"]) for d in document["derived"]) == [False, True]
    assert read_sql(data, tmp_path)  # a read drops and derives again
    r = invoke(data, "verify", RUN)
    assert "damaged" not in r.stdout and "every file as its digest records" in r.stdout, r.stdout


def test_a_collection_of_named_runs_reads_no_other_runs_files(warm):
    """Finding 6: a collection opened for one run could read every other run's stored rows."""
    from engine.catalog.queries import RefusedQueryError

    runs = open_runs(warm, [RUN])
    assert runs.query("select count(*) as n from trees")[0]["n"] == 4
    own = next((warm / "derived" / RUN).glob("*/*/views/trees-*.parquet"))
    assert runs.query(f"select count(*) as n from read_parquet('{own}')")[0]["n"] == 4
    for other in (
        next((warm / "derived" / "other").glob("*/*/views/trees-*.parquet")),
        next((warm / "derived" / "other").glob("*/*/tables/paths-*.parquet")),
        next((warm / "runs" / "other" / "log").glob("part-*.parquet")),
    ):
        with pytest.raises(RefusedQueryError, match="only the runs' logs may be read"):
            runs.query(f"select count(*) from read_parquet('{other}')")


@pytest.mark.slow
def test_a_resumed_campaign_decides_as_the_logs_say_whatever_derived_holds(tmp_path):
    """A campaign's policy reads its runs' logs, never their stored state: a campaign killed after its
    second round, resumed beside a forgery of every run's stored tables (digests rewritten), grants and
    grows exactly what its clean copy does."""
    from test_campaign import campaign_file, cli

    from engine.runset import open_campaign

    clean = tmp_path / "clean"
    first = cli(
        clean,
        "campaign",
        str(campaign_file(tmp_path, "coverage", {"edges": 45})),
        env={"TEACHER_MCTS_CRASH_AT": "campaign.decided:2"},
        check=False,
    )
    assert first.returncode == -9, first.stderr
    forged = tmp_path / "forged"
    shutil.copytree(clean, forged)
    assert invoke(forged, "audit").exit_code in (0, 1)  # every run's states derived
    assert forge_with_digests(forged) >= 3
    for data in (clean, forged):
        cli(data, "campaign", "--resume", "camp")
    grants = "select round, rule, task_run, tree_id, edges, gain from campaign_grants order by round, task_run, tree_id"
    assert open_campaign(forged, "camp").query(grants) == open_campaign(clean, "camp").query(grants)
    for run in ("camp-easy", "camp-hard", "camp-mixed"):
        assert _decisions(forged, run) == _decisions(clean, run), run
