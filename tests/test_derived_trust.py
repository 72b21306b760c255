"""A data directory is data, never code: stored derived state is trusted only if this user made it, nothing
under it runs, damage of every kind heals on the read that meets it, and nothing blocks.

The forgeries here are the strongest a data directory can carry: files whose digests are recomputed as
the code computes them, with another user's key (or, for the views' template, even with this user's
key: a template is never read from a data directory at all).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT
from test_derived_tamper import RUN, SELECT, _copy, fresh, invoke, log_bytes, read_sql, warm  # noqa: F401 - fixtures

from engine.derived import Derived
from engine.derived.catalogs import template_dir
from engine.derived.files import ABANDONED_S, dump_json, file_digest


@pytest.fixture
def other_key(tmp_path, monkeypatch):
    """Run the block under another user's key (a file of its own), then come back to this user's."""

    def use(fn):
        mine = os.environ.get("TEACHER_MCTS_KEY")
        key = tmp_path / "other.key"
        if not key.exists():
            key.write_bytes(os.urandom(32))
            key.chmod(0o600)
        monkeypatch.setenv("TEACHER_MCTS_KEY", str(key))
        try:
            return fn()
        finally:
            if mine is None:
                monkeypatch.delenv("TEACHER_MCTS_KEY")
            else:
                monkeypatch.setenv("TEACHER_MCTS_KEY", mine)

    return use


def sql(data: Path, query: str = SELECT[0], **env: str):
    """``sql`` in a process of its own (a reader that could hang is bounded by the subprocess' timeout)."""
    args = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "sql", query, "--json"]
    return subprocess.run(args, env=os.environ | env, capture_output=True, text=True, timeout=600)


def test_states_another_user_made_are_dropped_and_derived_again(warm, fresh, tmp_path, other_key):  # noqa: F811
    """A data directory copied from a colleague: every state, view file and source cache verifies under
    its maker's key, not this user's - each is dropped with a note and the answers are the log's."""
    data = _copy(warm, tmp_path)
    shutil.rmtree(data / "derived")
    other_key(lambda: read_sql(data, tmp_path))  # states made under the other key
    assert list((data / "derived").glob(f"{RUN}/*/*/state.json"))
    r = invoke(data, "verify", RUN)
    assert "not made by this user" in r.stdout and "DAMAGED" in r.stdout, r.stdout
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0 and r.stdout == fresh["read_sql"], r.output
    assert "dropped" in r.stderr and "source.json" in r.stderr, r.stderr
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.stdout == fresh["read_sql"] and "dropped" not in r.stderr  # rebuilt under this user's key


def test_a_forged_source_cache_signed_with_another_key_is_not_used(warm, fresh, tmp_path, other_key):  # noqa: F811
    """It claimed an earlier tail (a stale state would then be read, trees shown unstopped) and its check
    was recomputed as the code computes it - but with a key that is not this user's."""
    data = _copy(warm, tmp_path)
    path = data / "derived" / RUN / "source.json"
    held = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("check", "keyed")}
    held["source"]["tail"] //= 2
    held["source"]["parts"] = held["source"]["parts"][:1]
    path.write_text(other_key(lambda: dump_json(f"{RUN}/source.json", held)))
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0 and r.stdout == fresh["read_sql"], r.output
    assert "source.json dropped" in r.stderr


def forge_template(path: Path, secret: Path) -> None:
    """The empty catalog of the views at ``path``, its ``trees`` view replaced by one that reads ``secret``."""
    con = duckdb.connect(str(path))
    con.execute(
        "create or replace view trees as select 'x' as run_id, content as tree_id, 0 as best_score, "
        f"0 as kept_edges, 0 as top_path_score from read_text('{secret}')"
    )
    con.close()


def test_templates_come_from_no_data_directory(warm, fresh, tmp_path, monkeypatch, other_key):  # noqa: F811
    """Finding 1: a DuckDB file of the views' SQL under derived/_templates, its name's digest computed as
    the code does, made readers answer from forged views (and read any file). Templates live in this user's
    cache now; one planted in a data directory - even signed with this user's key - is never read, and one
    in the cache signed with another key is dropped."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    secret = tmp_path / "secret.txt"  # a file outside the data directory
    secret.write_text("the user's own file")
    data = _copy(warm, tmp_path)
    digest = Derived(data).digest
    shutil.rmtree(data / "derived" / RUN)
    assert read_sql(data, tmp_path) == fresh["read_sql"]  # (a state derived: the template made, in this cache)
    (cached,) = template_dir(digest).glob("catalog-*.duckdb")
    planted = data / "derived" / "_templates" / digest[:16]
    planted.mkdir(parents=True)
    forged = planted / "forged.duckdb"
    shutil.copy(cached, forged)
    forge_template(forged, secret)
    relative = f"_templates/{digest}"
    forged.rename(planted / f"catalog-{file_digest(relative, 'catalog', forged.read_bytes())}.duckdb")  # this key
    body = next(planted.iterdir()).read_bytes()
    cached.unlink()
    foreign = other_key(lambda: file_digest(relative, "catalog", body))
    cached.with_name(f"catalog-{foreign}.duckdb").write_bytes(body)
    shutil.rmtree(data / "derived" / RUN)  # states derived again: from a template
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0 and r.stdout == fresh["read_sql"], r.output
    assert secret.read_text() not in r.stdout
    assert "catalog-" in r.stderr and "dropped" in r.stderr, r.stderr  # the foreign one in the cache
    assert not (data / "derived" / "_templates").exists()  # (removed: nothing reads it)


def test_a_connection_that_builds_states_reads_nothing_outside_the_data_directory(warm, tmp_path):  # noqa: F811
    derived = Derived(warm)
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own file")
    with pytest.raises(duckdb.PermissionException):
        derived.con.execute(f"select * from read_text('{secret}')").fetchall()
    with pytest.raises(duckdb.PermissionException):
        derived.con.execute(f"copy (select 1) to '{warm.parent / 'out.csv'}'")
    own = next((warm / "runs" / RUN / "log").glob("part-*.parquet"))
    assert derived.con.execute(f"select count(*) from read_parquet('{own}')").fetchall()[0][0] > 0


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_a_state_missing_a_table_file_heals_on_the_read_that_meets_it(warm, fresh, tmp_path, what):  # noqa: F811
    """Finding 3: one missing table file failed paths, export, watch and an unstored view's sql on every
    run ('the log kept changing while its state was read'); a directory in its place, every read."""
    data = _copy(warm, tmp_path)
    for path in (data / "derived").glob(f"{RUN}/*/*/tables/int_turns-*.parquet"):
        path.unlink()
        if what == "directory":
            path.mkdir()
    r = invoke(data, "verify", RUN)
    assert "the next read drops each" in r.stdout, r.stdout
    before = log_bytes(data)
    r = invoke(data, "paths", RUN, "--json")
    assert r.exit_code == 0 and "dropped" in r.stderr, r.output
    r = invoke(data, "sql", RUN, "select count(*) as n from turns", "--json")  # an unstored view's rows
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["n"] > 0, r.output
    assert invoke(data, "sql", *SELECT, "--json").stdout == fresh["read_sql"]
    assert "damaged" not in invoke(data, "verify", RUN).stdout
    assert log_bytes(data) == before


@pytest.mark.slow
@pytest.mark.parametrize("where", ["state.json", "table", "source.json", "view"])
def test_a_fifo_where_a_stored_file_should_be_blocks_no_reader(warm, fresh, tmp_path, where):  # noqa: F811
    """Finding 4: a FIFO under derived/ hung readers and verify indefinitely (and a writer's keeper)."""
    data = _copy(warm, tmp_path)
    pattern = {
        "state.json": f"{RUN}/*/*/state.json",
        "table": f"{RUN}/*/*/tables/int_turns-*.parquet",
        "source.json": f"{RUN}/source.json",
        "view": f"{RUN}/*/*/views/trees-*.parquet",
    }[where]
    paths = list((data / "derived").glob(pattern))
    assert paths
    for path in paths:
        path.unlink()
        os.mkfifo(path)
    verify = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "verify", RUN],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert verify.returncode == 0, verify.stderr
    done = sql(data)
    assert done.returncode == 0 and done.stdout == fresh["read_sql"], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_fifo_under_derived_holds_no_exploration_up(tmp_path):
    """Finding 4, the writer: a FIFO among a run's stored states stopped ``explore`` in its state keeper
    (looking for a state to start from) before it recorded its selection and its end."""
    from conftest import SMALL, SNAPSHOTS

    from ingest.log import EventLog

    data = tmp_path / "data"
    for where in ("now/planted/state.json", "now/planted/views", "source.json"):
        path = data / "derived" / "fifo" / where
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    args = [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "explore", str(SNAPSHOTS), "--select"]
    args += ["--task", "kernel-speedup", "--num-roots", "2", "--run-id", "fifo", "--config", str(config)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    kinds = set(EventLog(data, "fifo").read_table().column("kind").to_pylist())
    assert {"paths_selected", "run_finished"} <= kinds, kinds


@pytest.mark.parametrize("name", ["source.json", "state.json"])
def test_a_document_nested_beyond_any_depth_is_damage_not_a_traceback(warm, fresh, tmp_path, name):  # noqa: F811
    """Finding 6: deeply nested JSON in a stored document raised RecursionError in every reader."""
    data = _copy(warm, tmp_path)
    pattern = f"{RUN}/source.json" if name == "source.json" else f"{RUN}/*/*/state.json"
    for path in (data / "derived").glob(pattern):
        path.write_text("[" * 200_000 + "]" * 200_000)
    r = invoke(data, "sql", *SELECT, "--json")
    assert r.exit_code == 0 and r.stdout == fresh["read_sql"], r.output
    assert "dropped" in r.stderr and "Traceback" not in r.output
    r = invoke(data, "verify", RUN)
    assert r.exit_code == 0 and "Traceback" not in r.output


def test_the_temporary_files_of_writers_that_are_gone_are_removed(warm, tmp_path):  # noqa: F811
    """Finding 3: a killed reader's temporary file, and the empty ones a full disk left, stayed for good."""
    data = _copy(warm, tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)  # a process that has ended
    views = next((data / "derived").glob(f"{RUN}/*/*/views"))
    left = [
        views / f".trees.tmp-{pid}-1.parquet",
        data / "derived" / RUN / f".source.json.tmp-{pid}-1",
        views.parent.parent / f".tmp-{pid}-abc",
    ]
    young = data / "derived" / RUN / f".source.json.tmp-{pid}-2"  # (another node's writer may still be writing)
    for path in [*left, young]:
        path.mkdir() if path.name.startswith(".tmp-") else path.write_bytes(b"")
    old = time.time() - ABANDONED_S - 60
    for path in left:
        os.utime(path, (old, old))
    for state in (data / "derived").glob(f"{RUN}/*/*/state.json"):
        state.unlink()  # so that the next read stores a state (and collects); its views/ stays
    assert read_sql(data, tmp_path)
    assert [p for p in left if os.path.lexists(p)] == [] and young.exists()


def test_the_key_is_kept_owner_only_and_a_key_others_may_read_is_not_used(tmp_path, monkeypatch, capfd):
    from engine.derived import trust

    monkeypatch.setenv("TEACHER_MCTS_KEY", str(tmp_path / "keys" / "derived.key"))
    first = trust.secret()
    path = tmp_path / "keys" / "derived.key"
    assert path.read_bytes() == first and path.stat().st_mode & 0o777 == 0o600
    trust._held.clear()
    assert trust.secret() == first  # the same key in the next process
    path.chmod(0o644)
    trust._held.clear()
    assert trust.secret() != first
    assert "others may read it" in capfd.readouterr().err
    trust._held.clear()
