"""Shared fixtures: temporary data dirs, snapshot folders, catalogs built from events, and the
explorations tests only read (run once per test session)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from click.testing import CliRunner  # noqa: E402

from engine.catalog import Catalog  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from ingest.events import Event, RunStarted  # noqa: E402
from ingest.schema import to_arrow  # noqa: E402

# Counts that tests report (the kill -9 soak, the fuzzing, checks left unselected), printed at the end.
REPORT: dict[str, str] = {}


def pytest_configure(config) -> None:
    """Tests send SIGINT to the processes they start, as a terminal's Ctrl-C does. A suite started
    in the background of a script has SIGINT ignored (as has each pytest-xdist worker it starts),
    and an ignored signal stays ignored in every child: its processes would ignore Ctrl-C (by
    design: cli.py keeps a disposition it was started with). The suite runs as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items) -> None:
    """The checks against the real CORAL run only when asked for (``-m real_coral``): CORAL is
    not on any package registry, so CI cannot install it. They are deselected, never skipped,
    and the summary says how many and how to run them."""
    if "real_coral" in (config.option.markexpr or ""):
        return
    left = [item for item in items if item.get_closest_marker("real_coral")]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker("real_coral")]
        REPORT["real_coral"] = (
            f"{len(left)} checks against the real CORAL not selected: CORAL_VENV=../coral-venv "
            "python -m pytest -m real_coral (or CORAL_SRC=path/to/CORAL)"
        )


def pytest_sessionfinish(session) -> None:
    """A worker of pytest-xdist hands its counts to the controller, which prints them."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["report"] = json.dumps(REPORT)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    REPORT.update(json.loads(getattr(node, "workeroutput", {}).get("report", "{}")))


def pytest_terminal_summary(terminalreporter) -> None:
    if REPORT:
        terminalreporter.section("counts of this session")
        for name in sorted(REPORT):
            terminalreporter.write_line(REPORT[name])


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def make_snapshot(
    root: Path,
    index: int,
    agent: str = "agent-1",
    score: object = 1.0,
    eval_ok: object = True,
    commit: str | None = None,
    with_eval_ok: bool = True,
    attempt_name: str | None = None,
    attempt: dict | None = None,
) -> Path:
    """One CORAL-style snapshot folder with its attempt JSON."""
    commit = commit or f"{index:08x}" + "ab" * 16
    folder = root / f"eval-{index:06d}-{agent}-{commit[:12]}"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "solution.py").write_text(f"VALUE = {index}\n")
    (folder / "shared" / "attempts").mkdir(parents=True)
    meta = {"commit_hash": commit, "eval_count": index, "agent_id": agent}
    if with_eval_ok:
        meta["eval_ok"] = eval_ok
    (folder / "metadata.json").write_text(json.dumps(meta))
    body = (
        attempt
        if attempt is not None
        else {
            "commit_hash": commit,
            "agent_id": agent,
            "score": score,
            "status": "improved",
        }
    )
    name = attempt_name or f"{commit}.json"
    (folder / "shared" / "attempts" / name).write_text(json.dumps(body, allow_nan=True))
    return folder


def catalog_of(events: list[Event], config: RunConfig | dict | None = None) -> Catalog:
    """A catalog over a run whose log is RunStarted(config) followed by ``events`` (a dict: the config
    recorded as given, as by an older version)."""
    config = config or RunConfig()
    recorded = config if isinstance(config, dict) else config.model_dump(mode="json")
    started = RunStarted(
        command="test",
        task=recorded["task"],
        direction=recorded["direction"] or "maximize",
        config=recorded,
    )
    catalog = Catalog.empty()
    catalog.insert(to_arrow([started, *events], "test-run", 1, datetime.now(UTC)))
    return catalog


SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
SMALL = """
[tree]
target_good_leaves = 4
"""
# A run that does not end on its own (its trees have no limit a run reaches) and whose
# turns take ~0.2 s each, so it hardly uses the CPU: tests that read a run while it is
# written stop it when they are done, so no speed of the machine makes it end first.
ENDLESS = """
[tree]
max_depth = 1000
hard_token_limit = 1000000000000
target_good_leaves = 1000000
max_valid_edges = 1000000
max_failed_expansions = 1000000
[backend_options]
latency_s = 0.2
"""


@pytest.fixture
def derived_made(monkeypatch) -> list:
    """The derived states built from now on in this process (the real class's, each counted as it is made)."""
    from engine.derived import Derived

    made: list = []
    build = Derived.__init__

    def counted(self, *args, **kwargs) -> None:
        made.append(self)
        build(self, *args, **kwargs)

    monkeypatch.setattr(Derived, "__init__", counted)
    return made


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Iterator[Path]:
    """A data dir with two small sim runs of 4 roots: ``rounds`` and ``async``.

    Tests read them; a test that changes a run, or adds one beside them, works on a copy (forge, copy_run):
    a command over every run must see these two whatever ran before it (checked when the session ends).
    """
    from cli import cli

    base = tmp_path_factory.mktemp("runs")
    data = base / "data"
    config = base / "small.toml"
    config.write_text(SMALL)
    for run, schedule, parallel in (("rounds", "rounds", "6"), ("async", "async", "3")):
        r = CliRunner().invoke(
            cli,
            [
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
                run,
                "--schedule",
                schedule,
                "--parallel",
                parallel,
                "--config",
                str(config),
            ],
        )
        assert r.exit_code == 0, r.output
    yield data
    added = sorted(p.name for p in (data / "runs").iterdir() if p.name not in ("rounds", "async"))
    assert not added, f"tests added runs to the shared runs, where every test reads them: {added} (use a copy)"


@pytest.fixture(scope="session")
def bundled(tmp_path_factory) -> Path:
    """A data dir holding ``main``: README's main job on the bundled Student run (read only)."""
    from cli import cli

    data = tmp_path_factory.mktemp("bundled") / "data"
    r = CliRunner().invoke(
        cli,
        [
            "--data",
            str(data),
            "explore",
            str(SNAPSHOTS),
            "--select",
            "--task",
            "kernel-speedup",
            "--parallel",
            "16",
            "--run-id",
            "main",
        ],
    )
    assert r.exit_code == 0, r.output
    return data


def copied_runs(runs: Path, tmp_path_factory, name: str) -> Path:
    """The shared runs copied into a data dir of their own (for a module that adds runs beside them)."""
    data = tmp_path_factory.mktemp(name) / "data"
    for run in ("rounds", "async"):
        copy_run(runs, run, data)
    return data


def copy_run(src: Path, run_id: str, dst: Path, new_id: str | None = None) -> str:
    """Copy a run's directory to another data dir (to change it without touching the original)."""
    import shutil

    from ingest.log import run_dir

    shutil.copytree(run_dir(src, run_id), run_dir(dst, new_id or run_id))
    if new_id and new_id != run_id:  # the copy's events are its own: rewritten, recorded anew
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ingest.log import EventLog, LogWriter, encode_part, part_name

        log = EventLog(dst, new_id)
        (log.log_dir / "_record.jsonl").unlink()  # the source's: it names the source run
        for part in log.parts():
            table = pq.read_table(part.path)
            table = table.set_column(
                table.column_names.index("run_id"), "run_id", pa.array([new_id] * table.num_rows, pa.string())
            )
            data, digest = encode_part(table, part.level)
            part.path.unlink()
            (log.log_dir / part_name(part.first, part.last, part.level, digest)).write_bytes(data.to_pybytes())
        LogWriter.open(dst, new_id).close()  # adopted: a record of the rewritten parts
    return new_id or run_id


def copy_with_other_knowledge(data: Path, run_id: str, new_id: str) -> None:
    """A copy of ``run_id`` named ``new_id`` whose config records another knowledge path pattern: its views'
    variables have other defaults, so it cannot share a catalog with the original."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ingest.log import EventLog, run_dir

    table = EventLog(data, run_id).read_table()
    rows = [dict(r, run_id=new_id) for r in table.to_pylist()]
    started = next(r for r in rows if r["kind"] == "run_started")
    config = json.loads(started["config"])
    config["knowledge"]["path_regex"] = "notes/"
    started["config"] = json.dumps(config)
    out = run_dir(data, new_id) / "log"
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out / f"part-{1:012d}-{len(rows):012d}-L0.parquet")


@pytest.fixture(scope="session")
def real_coral_bin(tmp_path_factory) -> Path:
    """A dir holding only the ``coral`` of the real CORAL: from ``$CORAL_VENV`` (the venv docs/REAL_RUNS.md
    has the user make), else installed from ``$CORAL_SRC`` into a venv of the test session."""
    given = os.environ.get("CORAL_VENV")
    if given:
        coral = Path(given).resolve() / "bin" / "coral"
        if not coral.exists():
            pytest.fail(f"CORAL_VENV={given}: no bin/coral there - make it as docs/REAL_RUNS.md says, or unset it")
        bin_dir = tmp_path_factory.mktemp("coral-bin")
        (bin_dir / "coral").symlink_to(coral)
        return bin_dir
    src = os.environ.get("CORAL_SRC")
    if not src:
        pytest.fail(
            "-m real_coral needs CORAL_VENV (a venv with CORAL installed) or CORAL_SRC (a checkout of "
            "Human-Agent-Society/CORAL, installed into a venv of the session)"
        )
    venv = tmp_path_factory.mktemp("coral-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A checkout without tags (or an archive) has no version for hatch-vcs to derive.
    env = dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION", "0.0.0+src"))
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", src], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    bin_dir = venv / "coral-bin"  # only `coral` (the venv's bin would put its python first on PATH)
    bin_dir.mkdir()
    (bin_dir / "coral").symlink_to(venv / "bin" / "coral")
    return bin_dir


def rename_in_record(data: Path, run_id: str, renames: dict[str, str]) -> None:
    """Rewrite a run's record as if its writer had published these parts under the new names.

    What a writer bug would leave (its entries chained and checksummed as a writer
    writes them), for tests of what ``verify`` finds beyond what readers check.
    """
    from ingest.events import canonical_json
    from ingest.log import RECORD, run_dir
    from ingest.record import _sha

    path = run_dir(data, run_id) / "log" / RECORD
    prev, lines = "", []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        entry["add"] = [renames.get(n, n) for n in entry["add"]]
        entry["remove"] = [renames.get(n, n) for n in entry["remove"]]
        entry["prev"] = prev
        entry["sha"] = _sha(entry)
        prev = entry["sha"]
        lines.append(canonical_json(entry))
    path.write_text("".join(line + "\n" for line in lines))
