"""Turns on a real Ray cluster: a head and a worker node started with `ray start` on this machine.

Each node offers ``teacher_slot`` units (the resource a turn's worker takes), so the
turns of a run are spread over two raylets as over two machines: two OpenCode
stores, sessions carried between them as exported files. The cluster uses token
authentication with a token of its own (Ray's default for new clusters), so a
token another cluster left in ~/.ray does not interfere.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ENDLESS, ROOT
from fake_model import FakeModel
from test_opencode_e2e import marked_processes, roots, script, student, wait_until_gone  # noqa: F401 - fixtures

from cli import cli
from engine.teachers.opencode.processes import Supervisor, descendants, kill_marked, started_at
from ingest.log import EventLog

pytestmark = pytest.mark.slow

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"


GUARD = Supervisor()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_nodes(mark: str) -> set[int]:
    """The processes of the cluster marked ``mark`` and theirs (Ray's agents overwrite their marks)."""
    return {child for pid in ray_marked(mark) for child in descendants(pid)} | set(ray_marked(mark))


def ray_marked(mark: str) -> list[int]:
    """The pids of the processes of the cluster marked ``mark``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"TEST_RAY_CLUSTER={mark}".encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def running(pid: int, start: str | None) -> bool:
    """Whether that process (its pid and start time) still runs (a zombie is done)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and started_at(pid) == start


# The `ray` command of the Python running the tests (beside it in a venv's bin/), else the one on PATH.
RAY = next((str(p) for p in [Path(sys.executable).parent / "ray"] if p.exists()), "ray")


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node, 2 teacher slots each; yields (address, env for its clients).

    Its processes carry a marker in their environment, and only they are stopped after
    (``ray stop`` would stop every Ray cluster of the machine).
    """
    port = free_port()
    mark = os.environ.get("TEST_RAY_CLUSTER_MARK") or secrets.token_hex(8)
    # The venv's bin first: `ray` is found there whether or not the venv is activated
    # (`venv/bin/python -m pytest`), and so are the processes Ray starts by name.
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        PATH=os.pathsep.join(
            [str(ROOT / "tests" / "fixtures" / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        TEST_RAY_CLUSTER=mark,
        # and killed by a watchdog when this process ends without its teardown (a second
        # Ctrl-C, SIGHUP of a closed terminal, kill -9): `ray start` daemonizes its nodes
        **GUARD.guard(),
    )
    env.pop("RAY_ADDRESS", None)
    node = ["--num-cpus", "1", "--resources", json.dumps({"teacher_slot": 2}), "--object-store-memory", "100000000"]
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                "--port",
                str(port),
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
                *node,
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run([RAY, "start", "--address", address, *node], env=env, check=True, capture_output=True)
        # (and what those nodes started that wrote its title over its environment: Ray's agents)
        GUARD.adopt(ray_nodes(mark))
        yield address, env
    finally:
        deadline = time.monotonic() + 120
        while kill_marked(mark, "TEST_RAY_CLUSTER") and time.monotonic() < deadline:
            time.sleep(0.2)


def explore(data: Path, run_id: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "explore", *args, "--run-id", run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def sim_args(config: Path) -> list[str]:
    return [str(SNAPSHOTS), "--select", "--task", "kernel-speedup", "--num-roots", "6", "--config", str(config)]


def query(data: Path, run_id: str, sql: str) -> list[dict]:
    r = CliRunner().invoke(cli, ["--data", str(data), "sql", run_id, sql, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def trees(data: Path, run_id: str) -> list[dict]:
    """What a run decided: its nodes and every decision event, without run ids, seqs or times."""
    return query(data, run_id, "select tree_id, node_id, parent_id, depth, q from nodes order by all") + query(
        data,
        run_id,
        "select * exclude (run_id, seq, recorded_at, watermark) from events where kind in "
        "('edge_judged', 'node_selected', 'tree_stopped', 'paths_selected') order by seq",
    )


def replays(data: Path, run_id: str) -> None:
    r = CliRunner().invoke(cli, ["--data", str(data), "replay", run_id])
    assert r.exit_code == 0 and ", 0 differ" in r.output, r.output


def turns_once(data: Path, run_id: str) -> None:
    twice = query(
        data,
        run_id,
        "select edge_id, turn, count(*) as n from events where kind = 'turn_finished' group by all having n > 1",
    )
    assert twice == []


def turn_workers(busy: bool = False) -> set[int]:
    """The pids of the cluster's TurnWorker actor processes (``busy``: those running a turn)."""
    title = b"ray::TurnWorker.run_turn" if busy else b"ray::TurnWorker"
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes().startswith(title):
                    found.add(int(entry))
            except OSError:
                continue
    return found


def test_a_rounds_sim_run_on_ray_has_the_trees_of_a_local_run(tmp_path, cluster):
    address, env = cluster
    config = tmp_path / "run.toml"
    config.write_text("parallel = 4\n")
    data = tmp_path / "data"
    local = explore(data, "local", env, *sim_args(config))
    assert local.returncode == 0, local.stderr
    on_ray = explore(data, "ray", env, *sim_args(config), "--executor", "ray", "--ray-address", address)
    assert on_ray.returncode == 0, on_ray.stderr
    assert "Traceback" not in on_ray.stderr
    replays(data, "ray")
    turns_once(data, "ray")
    assert trees(data, "ray") == trees(data, "local")
    assert len(query(data, "ray", "select * from nodes")) > 6  # the trees grew


def test_a_node_whose_teacher_cannot_start_is_named_not_a_traceback(tmp_path, cluster):
    """A node whose Teacher refuses to start (here: its endpoint does not answer) makes the run
    refuse with the node and the reason, as a node without the run directory does."""
    address, env = cluster
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    (tmp_path / "run").mkdir()
    code = (
        "import sys\n"
        "from engine.config import RunConfig\n"
        "from engine.mcts.cluster import RayExecutor\n"
        "from ingest.errors import ProjectError\n"
        "opts = {'model': 'fake/scripted', 'endpoint': sys.argv[3], 'eval_command': 'local-eval -m'}\n"
        "config = RunConfig(task='t', backend='opencode', parallel=1, backend_options=opts)\n"
        "try:\n"
        "    RayExecutor(config, sys.argv[1], sys.argv[2])\n"
        "except ProjectError as err:\n"
        "    print('refused:', err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run"), address, endpoint],
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: the node at " in done.stdout, done.stdout + done.stderr[-3000:]
    assert f"the model endpoint {endpoint} does not answer for model 'scripted': cannot reach it" in done.stdout


def test_a_worker_killed_mid_turn_costs_that_turn_only(tmp_path, cluster):
    """kill -9 of a TurnWorker while turns are in flight: Ray restarts it, its turn runs again."""
    address, env = cluster
    config = tmp_path / "run.toml"
    config.write_text("parallel = 4\n[backend_options]\nlatency_s = 0.4\n[tree]\nmax_depth = 2\n")
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            *sim_args(config),
            "--run-id",
            "killed",
            "--executor",
            "ray",
            "--ray-address",
            address,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log = EventLog(data, "killed")
        deadline = time.monotonic() + 600
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not (log.exists() and log.tail_seq() > 200 and turn_workers(busy=True))
        ):
            time.sleep(0.05)
        busy = turn_workers(busy=True)
        assert proc.poll() is None and busy, "the run did not get going"
        victim = min(busy)  # a worker in the middle of a turn
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert victim not in turn_workers()
    replays(data, "killed")
    turns_once(data, "killed")
    local = explore(data, "local", env, *sim_args(config))
    assert local.returncode == 0, local.stderr
    assert trees(data, "killed") == trees(data, "local")


def test_an_opencode_run_on_two_nodes_forks_across_their_stores(tmp_path, cluster, roots, student):  # noqa: F811
    """Real opencode on both nodes with the scripted model: turns of the run on each node,
    a session continued on the other node's store, and no process left after the run."""
    address, env = cluster
    model = FakeModel(script).start()
    config = tmp_path / "run.toml"
    config.write_text("parallel = 4\n[tree]\nroot_children = 2\nmax_children = 1\nmax_depth = 2\n")
    data = tmp_path / "data"
    try:
        r = explore(
            data,
            "oc",
            env,
            str(roots),
            "--task",
            "speedup",
            "--backend",
            "opencode",
            "--model",
            "fake/scripted",
            "--endpoint",
            model.base_url,
            "--config",
            str(config),
            "--coral-dir",
            str(student),
            "--executor",
            "ray",
            "--ray-address",
            address,
        )
    finally:
        model.stop()
    assert r.returncode == 0, r.stderr
    replays(data, "oc")
    turns_once(data, "oc")
    states = query(
        data,
        "oc",
        "select edge_id, turn, json_extract_string(state, '$.node') as node "
        "from events where kind = 'turn_finished' order by seq",
    )
    assert len({s["node"] for s in states}) == 2, states  # both nodes ran turns
    scores = query(data, "oc", "select count(*) as n from events where kind = 'eval_finished' and score is not null")
    assert scores[0]["n"] > 0  # the per-edge CORAL runs graded on the workers
    assert wait_until_gone(set(marked_processes(EventLog(data, "oc").dir))) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill -9"])
def test_the_writer_stopped_or_killed_on_ray_resumes_to_the_trees_of_a_local_run(tmp_path, cluster, sig):
    """The engine's process is the one that matters: stopped (its message, exit 143) or killed,
    its workers end with it, and a resume on the cluster grows the trees a local run grows."""
    address, env = cluster
    config = tmp_path / "run.toml"
    config.write_text("parallel = 4\n[backend_options]\nlatency_s = 0.3\n[tree]\nmax_depth = 2\n")
    data = tmp_path / "data"
    on_ray = ["--executor", "ray", "--ray-address", address]
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "--data",
            str(data),
            "explore",
            *sim_args(config),
            "--run-id",
            "stopped",
            *on_ray,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log = EventLog(data, "stopped")
        deadline = time.monotonic() + 600
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not (log.exists() and log.tail_seq() > 200 and turn_workers(busy=True))
        ):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and err.endswith("Terminated by SIGTERM.\n"), err
    deadline = time.monotonic() + 300
    while turn_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert turn_workers() == set(), "workers outlived the run's engine"
    resumed = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(data), "explore", "--resume", "stopped", *on_ray],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert resumed.returncode == 0, resumed.stderr
    replays(data, "stopped")
    turns_once(data, "stopped")
    local = explore(data, "local", env, *sim_args(config))
    assert local.returncode == 0, local.stderr
    assert trees(data, "stopped") == trees(data, "local")


def test_a_coverage_campaign_on_ray_makes_the_campaign_a_local_one_makes(tmp_path, cluster):
    """Two tasks' runs share the cluster's 4 teacher slots (2 each): the same grants and trees as on this machine."""
    address, env = cluster
    tasks = "".join(
        f'[[tasks]]\nname = "{name}"\nsource = "{SNAPSHOTS}"\nbackend_options = {{ hard_share = {hard} }}\n'
        for name, hard in (("easy", 0.0), ("hard", 0.8))
    )
    path = tmp_path / "camp.toml"
    path.write_text(
        'policy = "coverage"\nparallel = 4\n[budget]\nedges = 24\n[coverage]\nblocks_per_round = 2\n'
        "[explore]\nparallel = 2\nselection = { num_roots = 3 }\n" + tasks
    )
    data = {}
    for where in ("local", "ray"):
        data[where] = tmp_path / where
        args = ["--executor", "ray", "--ray-address", address] if where == "ray" else []
        done = subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "--data", str(data[where]), "campaign", str(path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    grants = "select round, task_run, tree_id, edges from campaign_grants order by all"
    from engine.runset import open_campaign

    assert open_campaign(data["ray"], "camp").query(grants) == open_campaign(data["local"], "camp").query(grants)
    for run in ("camp-easy", "camp-hard"):
        assert trees(data["ray"], run) == trees(data["local"], run)
        turns_once(data["ray"], run)
    r = CliRunner().invoke(cli, ["--data", str(data["ray"]), "replay", "camp"])
    assert r.exit_code == 0 and ", 0 differ" in r.output, r.output


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_test_session_stopped_any_way_leaves_no_ray_process(tmp_path, how):
    """After Ctrl-C of the suite, two Ray processes of the test cluster stayed behind; a test
    session killed outright never ran its teardown at all."""
    mark = secrets.token_hex(8)
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",  # (the session runs the test itself, as a developer's run of one test: no worker to outlive it)
            f"{__file__}::test_a_rounds_sim_run_on_ray_has_the_trees_of_a_local_run",
        ],
        cwd=ROOT,
        env=dict(os.environ, TEST_RAY_CLUSTER_MARK=mark),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 600
        while not any(b"cli.py" in cmdline(p) for p in ray_nodes(mark)) and time.monotonic() < deadline:
            time.sleep(0.2)  # both nodes up, and the test began (its first run carries the mark)
        started = {pid: (started_at(pid), cmdline(pid)) for pid in ray_nodes(mark) | descendants(session.pid)}
        assert session.poll() is None and len(started) > 4, "the cluster did not start"
        if how == signal.SIGINT:
            os.killpg(session.pid, how)  # a terminal's Ctrl-C: to its foreground group
        else:
            os.kill(session.pid, how)  # the OOM killer, `kill -9 PID`: to the session's process alone
        session.wait(timeout=600)
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
    assert_gone_once_watched(started)


def test_a_run_on_a_local_cluster_killed_with_kill_9_leaves_no_ray_process(tmp_path):
    """`explore --executor ray` without an address makes a cluster of its own. Killed outright,
    two of Ray's agents outlived it by a minute (their environment is overwritten by their
    title, so no mark finds them): its watchdog now kills every process of that cluster."""
    config = tmp_path / "endless.toml"
    config.write_text(ENDLESS)
    run = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "--data", str(tmp_path / "data"), "explore", *sim_args(config)]
        + ["--run-id", "killed", "--executor", "ray"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not any(b"TurnWorker" in cmdline(p) for p in descendants(run.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the cluster is up and its turns run
        started = {pid: (started_at(pid), cmdline(pid)) for pid in descendants(run.pid)}
        assert run.poll() is None and len(started) >= 3, started
    finally:
        run.kill()  # the process alone, not its group: as the OOM killer does
        run.wait()
    assert_gone_once_watched(started)


def assert_gone_once_watched(started: dict[int, tuple[str | None, bytes]]) -> None:
    """Once the watchdog among ``started`` (pid: start time, command line) has done its work,
    none of them runs."""
    watchdogs = [p for p, (_, command) in started.items() if b"processes.py" in command]
    assert watchdogs, "the cluster has no watchdog"
    deadline = time.monotonic() + 300
    while any(running(p, started[p][0]) for p in watchdogs) and time.monotonic() < deadline:
        time.sleep(0.2)  # the watchdog kills what it guards, then exits
    left = {p: command for p, (start, command) in started.items() if running(p, start)}
    for pid in left:  # (so that no other test meets them)
        os.kill(pid, signal.SIGKILL)
    assert left == {}
