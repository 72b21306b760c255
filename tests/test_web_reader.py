"""A process reads through one door (issue 55). serve's pages share the server's one derived state, so after the
first page no page opens a DuckDB instance of its own: the server runs in this process (uvicorn in a thread, the
app ``serve`` runs), its pages requested over the loopback as tests/test_web.py requests them, and every
``duckdb.connect`` counted (the real one called). Every other command that reads derived state builds one
(``engine.commandline.reader``), counted on the real class as the command runs in this process."""

from __future__ import annotations

import secrets
import socket
import threading
import time
import urllib.request
from contextlib import contextmanager
from urllib.parse import quote, urlencode

import duckdb
import pytest
import uvicorn
from click.testing import CliRunner
from conftest import SMALL, SNAPSHOTS
from test_web import two_runs  # noqa: F401 - fixture

from cli import cli
from engine.catalog import Catalog
from engine.web.app import create_app
from ingest.log import EventLog


@contextmanager
def in_process(data):
    """The app ``serve`` runs over ``data``, served by uvicorn in a thread of this process: (base, token, app)."""
    token = secrets.token_urlsafe(24)
    app = create_app(data, token)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start within 120 s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}", token, app
    finally:
        server.should_exit = True
        thread.join(60)
        listening.close()


def _get(url: str, token: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
        return answer.read().decode()


def test_serves_pages_open_no_duckdb_instance_after_the_first(two_runs, monkeypatch):  # noqa: F811
    catalog = Catalog.for_log(EventLog(two_runs, "rounds"))
    nodes = catalog.query(
        "select tree_id, parent_id from edges where verdict is not null group by all having count(*) > 1 "
        "order by tree_id, parent_id limit 3"
    )
    paths = catalog.query("select tree_id, leaf_id from top_paths order by tree_id, rank limit 3")
    catalog.close()
    assert len(nodes) == 3 and len(paths) == 3
    opened = []
    connect = duckdb.connect

    def counted(*args, **kwargs):
        opened.append(threading.current_thread().name)
        return connect(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counted)
    with in_process(two_runs) as (base, token, app):
        run = f"{base}/run/rounds/tree"
        compares = [f"{run}/{quote(n['tree_id'])}/compare?node={quote(n['parent_id'])}" for n in nodes]
        assert "attempt" in _get(compares[0], token)
        first = len(opened)
        assert first >= 1  # (the collection's instance and the derived state's)
        for url in compares[1:]:  # other nodes' attempts: each a run's catalog the page opens
            assert "attempt" in _get(url, token)
        for p in paths:  # a path's sample (a catalog of the run), and two paths side by side
            _get(f"{base}/run/rounds/path?tree={quote(p['tree_id'])}&leaf={quote(p['leaf_id'])}", token)
        same_tree = [p["leaf_id"] for p in paths if p["tree_id"] == paths[0]["tree_id"]]
        _get(f"{run}/{quote(paths[0]['tree_id'])}/paths?{urlencode([('leaf', leaf) for leaf in same_tree])}", token)
        _get(f"{base}/run/rounds", token)
        assert opened[first:] == []  # no page after the first opened an instance
        source = app.state.source
        assert source.collection().derived is source.reader.derived


def test_pages_read_at_once_share_the_servers_derived_state(two_runs):  # noqa: F811
    """Pages served at once in threads (as serve does) open catalogs through the one shared derived state."""
    catalog = Catalog.for_log(EventLog(two_runs, "async"))
    nodes = catalog.query(
        "select tree_id, parent_id from edges where verdict is not null group by all having count(*) > 1 "
        "order by tree_id, parent_id limit 4"
    )
    catalog.close()
    with in_process(two_runs) as (base, token, app):
        urls = [f"{base}/run/async/tree/{quote(n['tree_id'])}/compare?node={quote(n['parent_id'])}" for n in nodes]
        shown: list[str] = []
        threads = [threading.Thread(target=lambda u=u: shown.append(_get(u, token))) for u in urls * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert len(shown) == len(urls) * 2 and all("attempt" in s for s in shown)
        derived = app.state.source.reader.derived
        assert derived is app.state.source.collection().derived


def test_the_first_visit_of_a_cold_collection_says_what_it_is_doing(two_runs):  # noqa: F811
    """A collection with nothing derived: its first reading (every run derived) runs in a thread of its own, and
    the page answers at once that it is preparing it, looking again by itself (no script), until it shows it."""
    assert not (two_runs / "derived").exists()
    with in_process(two_runs) as (base, token, app):
        app.state.prepare_wait = 0  # (the page answers at once: the reading, deriving two runs, takes longer)
        first = _get(f"{base}/", token)
        assert 'id="preparing"' in first and "2 runs" in first
        assert '<meta http-equiv="refresh"' in first
        deadline = time.monotonic() + 300
        while 'id="preparing"' in (shown := _get(f"{base}/", token)):
            assert time.monotonic() < deadline, "the collection was not read within 300 s"
            time.sleep(0.2)
        assert "rounds" in shown and "async" in shown and "table" in shown
        assert app.state.source.ready(0, lambda runs: None)  # read once: no page waits again


READING = {  # each reading command, over the runs named
    "paths": ["paths", "rounds"],
    "watch": ["watch", "rounds", "--once"],
    "verify": ["verify", "async"],
    "sql": ["sql", "rounds", "async", "select count(*) as n from edges"],
    "audit": ["audit", "rounds", "async"],
    "report": ["report", "rounds", "async", "--out", "{tmp}/report.html"],
    "export": ["export", "rounds", "async", "--out", "{tmp}/chat"],
    "export-dpo": ["export", "rounds", "async", "--format", "dpo", "--out", "{tmp}/dpo"],
    "bundle": ["bundle", "rounds", "async", "--out", "{tmp}/bundle"],
}


@pytest.mark.parametrize("command", READING.values(), ids=READING.keys())
def test_a_command_builds_one_derived_state(runs, tmp_path, derived_made, command):
    """Paths, watch, verify, the collection's commands and export (each run's catalog opened through the
    command's reader, none beside it) read the runs through one derived state."""
    r = CliRunner().invoke(cli, ["--data", str(runs), *(a.format(tmp=tmp_path) for a in command)])
    assert r.exit_code == 0, r.output
    assert len(derived_made) == 1


def test_an_exploration_builds_one_derived_state(tmp_path, derived_made):
    """The writer stores its states without one (engine.derived.live) and reads its summary through one."""
    (tmp_path / "small.toml").write_text(SMALL)
    args = ["--select", "--task", "kernel-speedup", "--num-roots", "2", "--config", str(tmp_path / "small.toml")]
    r = CliRunner().invoke(cli, ["--data", str(tmp_path / "data"), "explore", str(SNAPSHOTS), *args])
    assert r.exit_code == 0, r.output
    assert len(derived_made) == 1
