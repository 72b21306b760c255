"""Issue 52, finding 8: names are unique as file systems see them. A run and a campaign never share a
name (a name on the command line stands for either), and no two names differ only in case or
Unicode normalisation (one directory on a case-insensitive file system), whoever creates them and
however they race. The logs the commands meet are made by hand (a campaign's run: one event)."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from ingest.errors import InputError
from ingest.events import CampaignTaskAdded, RunStarted
from ingest.log import EventLog, LogWriter
from ingest.names import CAMPAIGN, RUN, claim, claimed, clashes, folded
from tests.conftest import ROOT

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
CAMPAIGN_TOML = f"""policy = "fixed"
parallel = 1
[explore]
backend = "sim"
parallel = 1
selection = {{ num_roots = 1 }}
tree = {{ max_valid_edges = 1 }}
[[tasks]]
name = "a"
source = "{SNAPSHOTS}"
"""


def invoke(data: Path, *args: object):
    return CliRunner().invoke(cli, ["--data", str(data), *map(str, args)])


def make_log(data: Path, name: str, *events, kind: str = RUN) -> None:
    """A run's or a campaign's log holding a RunStarted and ``events``."""
    place = data / "campaigns" if kind == CAMPAIGN else data
    with LogWriter.create(place, name, kind) as writer:
        writer.append([RunStarted(command=kind), *events], expected_seq=0)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A data dir with the campaign ``camp`` (its task ``a``'s run ``camp-a``) and the run ``Sel-a``."""
    data = tmp_path_factory.mktemp("names") / "data"
    make_log(data, "camp", CampaignTaskAdded(task="a", task_run="camp-a", source=str(SNAPSHOTS)), kind=CAMPAIGN)
    make_log(data, "camp-a")
    make_log(data, "Sel-a")
    return data


@pytest.fixture
def data(built, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(built, copy)
    return copy


def entries(data: Path) -> dict[str, list[str]]:
    """The directories of runs and campaigns under ``data``."""
    return {d: sorted(p.name for p in (data / d).iterdir()) for d in ("runs", "campaigns/runs")}


def refused(r, *said: str) -> str:
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith("Error: "), r.stderr
    text = " ".join(r.stderr.split())  # (click wraps nothing, but a path may be long)
    for part in said:
        assert part in text, (part, r.stderr)
    return text


# ------------------------------------------------------------------ a run and a campaign never share a name


def test_a_run_named_after_a_campaign_is_refused_and_the_name_still_means_the_campaign(data, tmp_path):
    """`explore --run-id camp` was accepted beside the campaign `camp`; `audit camp` then audited the run."""
    before = entries(data)
    where = data / "campaigns" / "runs" / "camp"
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "kernel-speedup", "--run-id", "camp")
    refused(r, "run name 'camp' is taken by the campaign 'camp'", str(where), "choose another --run-id")
    r = invoke(data, "select-snapshots", SNAPSHOTS, tmp_path / "out", "--task", "t", "--run-id", "camp")
    refused(r, "taken by the campaign 'camp'", "choose another --run-id")
    assert entries(data) == before and not (tmp_path / "out").exists()
    r = invoke(data, "verify", "camp")  # the name still means the campaign: its log, then its run's
    heads = [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith(("campaign ", "run "))]
    assert r.exit_code == 0 and heads == ["campaign camp", "run camp-a"], r.output


def test_a_campaign_named_after_a_run_is_refused_before_anything_is_written(data, tmp_path):
    (tmp_path / "c.toml").write_text(CAMPAIGN_TOML)
    before = entries(data)
    r = invoke(data, "campaign", tmp_path / "c.toml", "--name", "camp-a")
    refused(r, "campaign name 'camp-a' is taken by the run 'camp-a'", str(data / "runs" / "camp-a"), "--name")
    assert entries(data) == before


# ------------------------------------------------------------------ names equal ignoring case


def test_names_that_differ_only_in_case_are_refused_for_runs_and_campaigns(data, tmp_path):
    """Campaigns `camp` and `CAMP`, runs `camp-a` and `Camp-A`, a campaign `sel` whose run `sel-a` meets the
    run `Sel-a`: each pair was accepted."""
    (tmp_path / "c.toml").write_text(CAMPAIGN_TOML)
    before = entries(data)
    case = "only in case"
    r = invoke(data, "campaign", tmp_path / "c.toml", "--name", "CAMP")
    refused(r, f"campaign name 'CAMP' differs {case} from the campaign 'camp'", "choose another --name")
    r = invoke(data, "campaign", tmp_path / "c.toml", "--name", "sel")  # its run sel-a
    refused(
        r,
        f"run name 'sel-a' differs {case} from the run 'Sel-a'",
        str(data / "runs" / "Sel-a"),
        "--name (its runs are <name>-<task>)",
    )
    r = invoke(data, "explore", SNAPSHOTS, "--select", "--task", "kernel-speedup", "--run-id", "Camp-A")
    refused(r, f"run name 'Camp-A' differs {case} from the run 'camp-a'", "choose another --run-id")
    r = invoke(data, "select-snapshots", SNAPSHOTS, tmp_path / "o", "--task", "t", "--run-id", "SEL-A")
    refused(r, f"run name 'SEL-A' differs {case} from the run 'Sel-a'")
    r = invoke(data, "select-snapshots", SNAPSHOTS, tmp_path / "o", "--task", "t", "--run-id", "Camp")
    refused(r, f"run name 'Camp' differs {case} from the campaign 'camp'")
    assert entries(data) == before
    # An empty directory a failed start left says so; the name itself is still free to take again.
    (data / "runs" / "left").mkdir()
    r = invoke(data, "select-snapshots", SNAPSHOTS, tmp_path / "o", "--task", "t", "--run-id", "LEFT")
    refused(r, "from the run 'left'", "holds no log", "remove it if nothing in it is needed")
    make_log(data, "left")
    assert EventLog(data, "left").exists()


def test_names_are_compared_normalised_and_case_folded(tmp_path):
    assert folded("Camp-A") == folded("camp-a") and folded("ＣＡＭＰ") == folded("camp") and folded("ß") == "ss"
    (tmp_path / "runs" / "ＣＡＭＰ").mkdir(parents=True)  # not a run id, but one directory to some file systems
    with pytest.raises(InputError, match="differs only in case or Unicode form from the run 'ＣＡＭＰ'"):
        claim(tmp_path, [(CAMPAIGN, "camp")])
    assert claim(tmp_path, [(RUN, "camp2")]) == [tmp_path / "runs" / "camp2"]
    assert claim(tmp_path, [(RUN, "camp2")]) == []  # its own name again: the creator's to judge


# ------------------------------------------------------------------ a start that fails


@pytest.mark.slow
def test_a_start_that_fails_before_its_first_event_leaves_no_directory_in_the_way(data, tmp_path):
    """A run or campaign whose first part cannot be written (files capped at 2 KiB by ``ulimit -f``: what a full
    disk does) ends in its `Error:`, and the directories its name claimed are gone: no name of a run that never
    was stands in the way of another differing only in case."""
    (tmp_path / "c.toml").write_text(CAMPAIGN_TOML)
    before = entries(data)
    starts = {
        "w1": ["explore", SNAPSHOTS, "--select", "--task", "kernel-speedup", "--num-roots", "1", "--run-id", "w1"],
        "w2": ["campaign", tmp_path / "c.toml", "--name", "w2"],  # and its run w2-a
        "w3": ["select-snapshots", SNAPSHOTS, tmp_path / "out", "--task", "t", "--run-id", "w3"],
    }
    for name, args in starts.items():
        command = [sys.executable, ROOT / "cli.py", "--data", data, *args]
        capped = ["sh", "-c", 'ulimit -f 2 && exec "$@"', "sh", *map(str, command)]
        done = subprocess.run(capped, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("Error: ") and "cannot write this part of the log" in done.stderr, done.stderr
        assert entries(data) == before, name
        assert clashes(data, RUN, name.upper()) == clashes(data, CAMPAIGN, name.upper()) == []
    assert not (tmp_path / "out").exists()


def test_a_failed_start_keeps_a_directory_another_writer_of_the_same_name_holds(tmp_path):
    """Two commands given the same new name: the one whose start fails removes the directory it made only if
    no writer holds it (the other's writer lock, taken on its own open file as another process's would be)."""
    for other_writes in (False, True):
        data = tmp_path / str(other_writes)
        other = None
        with pytest.raises(InputError, match="the start failed"), claimed(data, [(RUN, "n")]):
            if other_writes:  # the other command, its log still without an event
                other = LogWriter.create(data, "n")
            raise InputError("the start failed")
        assert (data / "runs" / "n").exists() == other_writes
        if other is not None:
            other.close()


# ------------------------------------------------------------------ two creators racing


def _create(data_dirs: list[str], place: str, name: str, barrier, results) -> None:
    """Create ``name`` in each data dir in turn, at the same moment as the other process does its own."""
    for data in data_dirs:
        barrier.wait()
        kind = CAMPAIGN if place == "campaigns" else RUN
        try:
            with LogWriter.create(Path(data) / place if place else Path(data), name, kind) as writer:
                writer.append([RunStarted(command="test", config={})], expected_seq=0)
            results.put((data, name, "created"))
        except Exception as err:  # (the refusal, named)
            results.put((data, name, f"{type(err).__name__}: {err}"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "second"),
    [(("", "x"), ("", "X")), (("", "y"), ("campaigns", "y"))],
    ids=["runs x and X", "run and campaign y"],
)
def test_two_processes_creating_names_that_clash_at_once_never_both_succeed(tmp_path, first, second):
    """Each round, two processes released by one barrier create clashing names in a fresh data dir:
    exactly one is created, the other refused naming it."""
    rounds = [str(tmp_path / f"d{i}") for i in range(12)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_create, args=(rounds, *who, barrier, results)) for who in (first, second)]
    for worker in workers:
        worker.start()
    outcomes: dict[str, list[str]] = {d: [] for d in rounds}
    for _ in range(2 * len(rounds)):
        data, _name, outcome = results.get()
        outcomes[data].append(outcome)
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    for data, said in outcomes.items():
        assert sorted(s == "created" for s in said) == [False, True], (data, said)
        refusal = next(s for s in said if s != "created")
        assert refusal.startswith("InputError: ") and ("only in case" in refusal or "is taken by" in refusal)
