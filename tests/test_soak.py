"""The kill -9 soak in CI: three dozen sim explorations killed at random moments and resumed.

``tests/soak.py`` holds the trials (and runs hundreds as a script); the counts are
printed at the end of the test session.
"""

from __future__ import annotations

import random

import pytest
from conftest import REPORT
from soak import OUTSIDE, SIGNALS, Soak, Trial, soak

from ingest.faults import POINTS

TRIALS = 42


@pytest.mark.slow
def test_kill_9_soak_every_trial_resumes_to_a_sound_log(tmp_path):
    seed = random.randrange(10**6)
    try:
        tally = soak(tmp_path, TRIALS, seed)
    except AssertionError as err:
        raise AssertionError(f"soak seed {seed} (python tests/soak.py --trials {TRIALS} --seed {seed}): {err}") from err
    REPORT["soak"] = f"{tally.line()} (seed {seed})"
    # A kill at a write's first arrival can land before the run's first part: it starts again.
    assert tally.trials == TRIALS and tally.resumes >= TRIALS - 4
    assert set(POINTS) | {OUTSIDE} | set(SIGNALS) <= set(tally.by_moment), tally.by_moment
    assert tally.kills > TRIALS  # some resumes were killed too
    assert tally.spooled_reused > 0  # a kill at spool.renamed leaves a turn only the spool holds


@pytest.mark.slow
def test_a_signal_in_the_middle_of_a_fill_publishes_none_of_it_and_the_resumed_run_is_the_same(tmp_path):
    """SIGHUP, SIGTERM or SIGINT while the engine stages a batch's edge starts: the unwinding
    publishes the whole steps before it and nothing of the fill, so the resumed rounds run
    grows the trees an uninterrupted one grows (a half-published fill made a smaller batch)."""
    runner = Soak(tmp_path)
    starts = runner.references["rounds"].reached["edge.started"]
    assert starts > 6
    for i, name in enumerate(SIGNALS, start=1):
        for arrival in (2, starts // 2 + i):  # within the first fill, and one later on
            runner.run(Trial("rounds", "edge.started", arrival=arrival, signal=name), 100 * i + arrival)
    assert runner.tally.trials == 2 * len(SIGNALS)


@pytest.mark.slow
def test_spooled_turns_of_another_run_are_dropped_said_in_the_log_and_run_again(tmp_path):
    """Another run of the same id (another seed) left its spool: its turns are not this run's."""
    import os
    import shutil

    from click.testing import CliRunner
    from soak import ROOT, RUN, _killed, _turns
    from soundness import tree_shape

    from cli import cli
    from engine.catalog import Catalog
    from ingest.faults import CRASH_ENV
    from ingest.log import EventLog, run_dir

    runner = Soak(tmp_path)
    ref = runner.references["rounds"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{CRASH_ENV: f"spool.renamed:{ref.reached['spool.renamed'] // 2}"})
    mine, other = tmp_path / "mine", tmp_path / "other"
    _killed(runner._args(mine, "rounds"), env, mine, 0, 0.0)
    args = runner._args(other, "rounds")
    args[args.index("--seed") + 1] = "4"
    _killed(args, env, other, 0, 0.0)
    spool = run_dir(mine, RUN) / "spool"
    shutil.rmtree(spool)
    shutil.copytree(run_dir(other, RUN) / "spool", spool)
    assert list(spool.glob("*.arrow"))
    r = CliRunner().invoke(cli, ["--data", str(mine), "explore", "--resume", RUN])
    assert r.exit_code == 0, r.output
    dropped = Catalog.for_log(EventLog(mine, RUN)).query("select reason from stg_spool_entry_dropped")
    assert dropped and all("another run" in d["reason"] for d in dropped)
    assert _turns(mine) == ref.turns and tree_shape(mine, RUN) == ref.shape
