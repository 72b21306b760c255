"""Turns served by long-lived ``opencode serve`` processes (the default): many at once, lanes, a server's loss.

Real opencode, real git, the scripted model server of tests/fake_model.py, the
self-contained eval command of tests/fixtures/bin (``local-eval``).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_model import FakeModel, Stall
from test_opencode_e2e import (  # noqa: F401 - fixtures
    coral_on_path,
    explore_opencode,
    local_script,
    marked_processes,
    roots,
)

from cli import cli
from engine.catalog import Catalog
from ingest.log import EventLog

WIDE = 64  # four servers, each with its own database (a lane)


@pytest.mark.slow
def test_64_concurrent_turns_each_record_what_the_model_received(tmp_path, roots, coral_on_path):  # noqa: F811
    """64 turns at once (a tree of 64 edges, two turns each: the second a fork of the first), the
    model taking a second a step, on servers of 16 turns with a database each: every turn
    completes, its requests are its own session's and recorded whole, and every exported
    sample is what the model received.

    OpenCode 1.18.33 can stall under this load (once here, on a machine loaded beside it: a
    server spun in its allocator, its API silent). The watchdog then kills that server and
    its turns are backend errors, whose evals score nothing (their edges retried); the run
    goes on (its error limit is the width), and every other turn is checked as before."""
    model = FakeModel(local_script).start()
    model.delay_s = 1.0
    config = tmp_path / "wide.toml"
    config.write_text(
        f"parallel = {WIDE}\nbackend_error_limit = {WIDE}\n"
        f"[tree]\nroot_children = {WIDE}\nmax_children = {WIDE}\nmax_depth = 1\n"
        # a served turn takes ~124 MB (docs/REAL_RUNS.md): the default 300 would ask for 19 GB
        # free, which this machine lacks while another test runs beside this one
        "[backend_options]\nturn_memory_mb = 150\n"
    )
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "wide", "--eval-command", "local-eval -m")
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    cat = Catalog.for_log(EventLog(data, "wide"))
    lost = cat.query("select edge_id, error from stg_turn_finished where outcome = 'error'")
    # (a server the watchdog killed, or one that left a request unanswered for its 2 minutes: lost either way)
    silent = ("opencode serve lost the turn: opencode serve answered nothing", "opencode serve did not answer")
    assert all(any(why in t["error"] for why in silent) for t in lost), lost
    turns = cat.query(  # the turns that ran (a skipped turn 2 has no outcome)
        "select edge_id, turn, session_id, outcome from turns "
        "where outcome is not null and outcome <> 'error' order by edge_id, turn"
    )
    assert {t["outcome"] for t in turns} == {"completed"} and len({t["session_id"] for t in turns}) == len(turns)
    # (the script's T001/e1-1 writes code the grader cannot score: its turn 2 is skipped, the edge retried)
    kept = [e["edge_id"] for e in cat.query("select edge_id from edges where verdict = 'kept'")]
    assert not {t["edge_id"] for t in lost} & set(kept)
    if lost:
        assert len(kept) >= 6  # the six paths exported below
    else:
        assert len(kept) == WIDE and len(turns) > 2 * WIDE
    # The turns ran together: more than half of them were in flight at one moment.
    spans = cat.query("select started_at, wall_seconds from stg_turn_finished")
    assert max(_overlap(spans)) > WIDE // 2
    # ... on several servers (16 turns a server), each writing a database of its own.
    lanes = list((data / "runs" / "wide" / "opencode" / "data" / "opencode").glob("opencode*.db"))
    assert len(lanes) >= 2, lanes
    # Each session's requests are its own turn's (the recorder keyed them right), all recorded.
    recorded = {
        (c["edge_id"], c["turn"]): c["model_calls"]
        for c in cat.query("select edge_id, turn, model_calls from stg_conversation_recorded")
    }
    for t in turns:
        mine = [q for q in model.requests if q["session"] == t["session_id"] and q["tools"]]
        assert {(q["where"]["edge"], q["where"]["turn"]) for q in mine} == {(t["edge_id"], t["turn"])}, t
        assert recorded[(t["edge_id"], t["turn"])] == len(mine), t
    # Every sample of the export is what the model received in its path's last turn, and its answer.
    out = tmp_path / "train"
    done = CliRunner().invoke(cli, ["--data", str(data), "export", "wide", "--out", str(out)])
    assert done.exit_code == 0, done.output
    samples = [json.loads(line) for line in (out / "wide.chat.jsonl").read_text().splitlines()]
    assert len(samples) == 6
    worktrees = re.escape(str((data / "runs" / "wide" / "worktrees").resolve()))

    def placed(value):  # the placeholder, applied independently of the exporter
        return json.loads(re.sub(worktrees + r"/T001/[^/\"]+/wt", "/workspace", json.dumps(value)))

    for sample in samples:
        (leaf,) = cat.query(
            "select t.edge_id, t.session_id from turns as t join nodes as n on n.edge_id = t.edge_id "
            "where n.node_id = ? and t.turn = 2",
            [sample["metadata"]["leaf_id"]],
        )
        last = [q for q in model.requests if q["session"] == leaf["session_id"] and q["tools"]][-1]
        answer = {"role": "assistant", "content": f"Done with {leaf['edge_id']} turn 2."}
        assert sample["messages"] == [*placed(last["messages"]), answer]
        assert json.loads(sample["tools"]) == placed(last["tool_list"])
    assert marked_processes(EventLog(data, "wide").dir) == []


def _overlap(spans: list[dict]) -> list[int]:
    """How many of the spans (``started_at``, ``wall_seconds``) were open at each span's start."""
    from datetime import datetime

    opened = [(datetime.fromisoformat(s["started_at"]).timestamp(), s["wall_seconds"]) for s in spans]
    return [sum(1 for b, w in opened if b <= a < b + w) for a, _ in opened]


def signalling(signal: str):
    """A script whose first edge's turn sends ``signal`` to its OpenCode (the server, for a served
    turn); the others work."""

    def script(edge: str, turn: int, step: int, workdir: str):
        if edge.endswith("/e1-1") and step == 0:
            return [("bash", {"command": f"kill -{signal} $PPID; sleep 600"})]
        return local_script(edge, turn, step, workdir)

    return script


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signal", "why"),
    [("9", "opencode serve exited with -9"), ("STOP", "opencode serve answered nothing for 3 s and was killed")],
)
def test_a_served_turn_whose_server_dies_is_a_backend_error_and_the_next_gets_a_new_server(
    tmp_path,
    roots,  # noqa: F811
    coral_on_path,  # noqa: F811
    monkeypatch,
    signal,
    why,
):
    """A tool that kills the server, or stops it (a server that answers nothing, as one that spun
    in its allocator did, is killed by its watchdog), ends the turns it carried as backend errors
    (never an edge the tree keeps), leaves no process, and the next turn starts a new server and
    completes."""
    from engine.config import RunConfig
    from engine.teachers import RootInfo, TurnRequest
    from engine.teachers.opencode import OpenCodeTeacher
    from engine.teachers.opencode import server as served
    from ingest.events import ToolCalled, TurnFinished

    monkeypatch.setattr(served, "STALL_S", 3.0)
    model = FakeModel(signalling(signal)).start()
    config = RunConfig(
        task="speedup",
        backend="opencode",
        backend_options={"model": "fake/scripted", "endpoint": model.base_url, "eval_command": "local-eval -m"},
    )
    teacher = OpenCodeTeacher(config, tmp_path / "run")
    try:
        folder = next(roots.iterdir())
        start = teacher.root_state(RootInfo("T001", str(folder), 1.0, None))

        def turn(slot: int) -> list:
            ids = {"tree_id": "T001", "edge_id": f"T001/e{slot}-1", "parent_id": "T001", "slot": slot}
            request = TurnRequest(
                **ids, attempt=1, direction="maximize", turn=1, start_state=start, fork=True, timeout_s=300
            )
            return teacher.run_turn(request, threading.Event())

        first = turn(1)
        (server,) = [lane.server for lane in teacher.servers._lanes]  # dead, not yet replaced
        second = turn(2)
        (after,) = teacher.servers.live()  # its replacement, on the same lane's database
    finally:
        teacher.close()
        model.stop()
    (killed,) = [f for f in first if isinstance(f, TurnFinished)]
    assert killed.outcome == "error" and f"opencode serve lost the turn: {why}" in killed.error, killed.error
    (done,) = [f for f in second if isinstance(f, TurnFinished)]
    assert done.outcome == "completed", done.error
    assert len([f for f in second if isinstance(f, ToolCalled)]) == 4
    assert teacher.servers.live() == [] and not server.alive() and after is not server
    assert marked_processes(Path(tmp_path / "run").resolve()) == []


def losing_the_server(carried: int, deadline_s: float = 600.0):
    """A script whose first ``carried`` turn 1s each wait at their first step until all are in flight,
    then the first kills their server (SIGKILL), the others' answers held until it is gone."""
    arrived, everyone = set(), threading.Condition()

    def script(edge: str, turn: int, step: int, workdir: str):
        first = {f"/e{k}-1" for k in range(1, carried + 1)}
        if turn != 1 or step != 0 or edge[edge.rindex("/") :] not in first:
            return local_script(edge, turn, step, workdir)
        with everyone:
            arrived.add(edge)
            everyone.notify_all()
            everyone.wait_for(lambda: len(arrived) == carried, timeout=deadline_s)
        if edge.endswith("/e1-1"):
            return [("bash", {"command": "kill -9 $PPID; sleep 600"})]
        return Stall()

    return script


@pytest.mark.slow
def test_a_server_lost_with_several_turns_counts_once_toward_the_backend_error_limit(
    tmp_path,
    roots,  # noqa: F811
    coral_on_path,  # noqa: F811
):
    """One ``opencode serve`` carries four turns and is killed under them: the four are backend
    errors naming that server, and they count once in the streak (int_turns__failing), so a limit
    of 2 does not stop the run; the edges run again on a new server and the run ends well."""
    model = FakeModel(losing_the_server(4)).start()
    config = tmp_path / "lose.toml"
    config.write_text(
        "parallel = 4\nbackend_error_limit = 2\n[tree]\nroot_children = 4\nmax_children = 4\nmax_depth = 1\n"
        "[backend_options]\nserver_width = 4\nturn_memory_mb = 150\n"  # (one server carries all four)
    )
    data = tmp_path / "data"
    try:
        r = explore_opencode(data, roots, model, config, "lose", "--eval-command", "local-eval -m")
    finally:
        model.stop()
    assert r.exit_code == 0, r.output
    cat = Catalog.for_log(EventLog(data, "lose"))
    failed = cat.query("select seq, edge_id, error, lost_server from stg_turn_finished where outcome = 'error'")
    assert sorted(f["edge_id"] for f in failed) == [f"T001/e{k}-1" for k in range(1, 5)], failed
    assert all("opencode serve lost the turn: opencode serve exited with -9" in f["error"] for f in failed), failed
    assert len({f["lost_server"] for f in failed}) == 1 and failed[0]["lost_server"] is not None
    # At each of them the streak was one loss, under the limit of 2, however their records fell among
    # the turns run again on a new server (one finished well resets the count of turns) ...
    finished = cat.query("select seq, outcome from stg_turn_finished order by seq")
    for f in failed:
        good = max((t["seq"] for t in finished if t["seq"] < f["seq"] and t["outcome"] != "error"), default=0)
        turns = sum(1 for t in finished if good < t["seq"] <= f["seq"])
        cat.variables.set(watermark=f["seq"])
        assert cat.query("select streak, turns from int_turns__failing") == [{"streak": 1, "turns": turns}], f
    cat.variables.set(watermark=None)
    # ... and the edges ran again and were kept or pruned by their evals
    again = cat.query("select count(*) as n from stg_turn_finished where outcome = 'completed'")[0]["n"]
    assert again >= 4 and cat.query("select streak from int_turns__failing") == [{"streak": 0}]
    assert marked_processes(EventLog(data, "lose").dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("node", [None, "node-a"])
def test_a_fork_whose_sources_lane_is_full_runs_in_a_new_lane_with_its_own_database(
    tmp_path,
    roots,  # noqa: F811
    coral_on_path,  # noqa: F811
    node,
):
    """Each server writes a database of its own (a lane). A turn whose source session's lane has
    no room goes to a new lane: its source is copied into that lane's database, the fork runs
    there in its own worktree, and the turn is what the model received, as in the first lane.
    On a cluster node, the turn's session is exported for the other nodes from its lane."""
    import sqlite3

    from engine.config import RunConfig
    from engine.teachers import RootInfo, TurnRequest
    from engine.teachers.opencode import OpenCodeTeacher
    from ingest.events import ToolCalled, TurnFinished

    model = FakeModel(local_script).start()
    options = {"model": "fake/scripted", "endpoint": model.base_url, "eval_command": "local-eval -m"}
    config = RunConfig(task="speedup", backend="opencode", backend_options={**options, "server_width": 2})
    teacher = OpenCodeTeacher(config, tmp_path / "run", node=node)
    store = teacher.environment.database.parent

    def sessions(database: Path) -> set[str]:
        with sqlite3.connect(database) as con:
            return {row[0] for row in con.execute("select id from session")}

    try:
        folder = next(roots.iterdir())
        start = teacher.root_state(RootInfo("T001", str(folder), 1.0, None))
        ids = {"tree_id": "T001", "edge_id": "T001/e2-1", "parent_id": "T001", "slot": 2, "attempt": 1}
        first = teacher.run_turn(
            TurnRequest(**ids, direction="maximize", turn=1, start_state=start, fork=True, timeout_s=300),
            threading.Event(),
        )
        (one,) = [f for f in first if isinstance(f, TurnFinished)]
        assert one.outcome == "completed", one.error
        assert one.session_id in sessions(store / "opencode.db")
        # A fork's last message is the previous turn's answer: no answer to a prompt not yet taken
        # (a waiter woken by a dropped event stream looks then), and quiet is told from not begun.
        server, lane = teacher.servers.acquire(one.session_id)
        fork = server.fork(one.session_id)
        base = len(server.messages(fork))
        assert base > 4 and server.progress(fork, base) == ("running", None)
        assert server.progress(fork, 0)[0] == "answered"  # (what a look from its start finds: turn 1's)
        teacher.servers.release(server, lane)
        held = [teacher.servers.acquire(one.session_id) for _ in range(2)]  # lane 0 is full
        assert {lane.index for _, lane in held} == {0}
        second = teacher.run_turn(
            TurnRequest(**ids, direction="maximize", turn=2, start_state=one.state, fork=True, timeout_s=300),
            threading.Event(),
        )
        for server, lane in held:
            teacher.servers.release(server, lane)
        servers = len(teacher.servers.live())
        (two,) = [f for f in second if isinstance(f, TurnFinished)]
        assert two.outcome == "completed", two.error
        lane1 = sessions(store / "opencode-lane1.db")
        assert {one.session_id, two.session_id} <= lane1 and two.session_id not in sessions(store / "opencode.db")
    finally:
        teacher.close()
        model.stop()
    assert servers == 2
    if node:  # exported whole, from the lane that holds it
        exported = json.loads(Path(two.state["session_file"]).read_text())
        assert exported["info"]["id"] == two.session_id and len(exported["messages"]) > 4
    # The fork ran in its own worktree, from the first turn's conversation, and was recorded whole.
    calls = [f for f in second if isinstance(f, ToolCalled)]
    assert [(c.tool, c.status) for c in calls] == [("read", "ok"), ("read", "error"), ("write", "ok"), ("bash", "ok")]
    mine = [q for q in model.requests if q["session"] == two.session_id and q["tools"]]
    assert {(q["where"]["edge"], q["where"]["turn"]) for q in mine} == {("T001/e2-1", 2)}
    assert "Done with T001/e2-1 turn 1." in json.dumps(mine[0]["messages"])
    assert (Path(two.state["worktree"]) / "solution.py").read_text() == "VALUE = 1.122\n"
    assert marked_processes(Path(tmp_path / "run").resolve()) == []


@pytest.mark.slow
def test_a_server_killed_a_moment_ago_is_lost_and_a_live_one_is_not(tmp_path, coral_on_path):  # noqa: F811
    """A request can fail while the server is on its way out (its sockets closed, its process not yet
    gone): such a turn names the lost server, as every other turn of that crash does, so the crash
    counts once. A live server that failed a request is not lost (each of its turns counts)."""
    import os
    import signal

    from engine.config import RunConfig
    from engine.teachers.opencode import OpenCodeTeacher

    model = FakeModel(local_script).start()
    options = {"model": "fake/scripted", "endpoint": model.base_url, "eval_command": "local-eval -m"}
    config = RunConfig(task="speedup", backend="opencode", backend_options=options)
    teacher = OpenCodeTeacher(config, tmp_path / "run")
    try:
        server, lane = teacher.servers.acquire(None)
        assert server.lost() is None and server.alive()
        os.kill(server.proc.pid, signal.SIGKILL)
        assert server.lost() == server.name  # (however soon after the kill it is asked)
        teacher.servers.release(server, lane)
    finally:
        teacher.close()
        model.stop()


def test_a_file_that_is_no_database_among_the_lanes_is_named_not_a_traceback(tmp_path):
    """A store's lane databases are looked up by name: a file there that is not one (dropped in,
    truncated) is a clean error naming it; a database its server is still creating holds nothing."""
    import sqlite3

    from engine.teachers.opencode.sessions import has_session
    from ingest.errors import ProjectError

    junk = tmp_path / "opencode-lane1.db"
    junk.write_bytes(b"not sqlite " * 100)
    with pytest.raises(ProjectError, match=re.escape(f"{junk}: not a readable OpenCode database")):
        has_session(junk, "ses_x")
    empty = tmp_path / "opencode-lane2.db"
    sqlite3.connect(empty).close()
    assert has_session(empty, "ses_x") is False


@pytest.mark.slow
def test_a_directory_refilled_while_it_is_removed_is_removed(tmp_path):
    """A turn 2 failed with 'Directory not empty': it replaces its worktree's shared dir while a process
    the last turn left (a server's detached plugin install) still writes into it for a moment."""
    import time

    from engine.teachers.opencode.worktrees import remove_tree

    shared = tmp_path / "wt" / ".opencode"
    (shared / "node_modules").mkdir(parents=True)
    for i in range(300):
        (shared / "node_modules" / f"file{i}").write_text("x")
    writing = threading.Event()

    def writer() -> None:  # writes while its directory is there (never makes it again), 5 s at most
        i, stop = 0, time.monotonic() + 5
        with contextlib.suppress(OSError):
            while time.monotonic() < stop:
                (shared / "node_modules" / f"new{i}").write_text("y")
                writing.set()
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    assert writing.wait(timeout=60)
    remove_tree(shared)
    thread.join(timeout=60)
    assert not shared.exists() and (tmp_path / "wt").is_dir()
    remove_tree(shared)  # (nothing there: nothing to do)
