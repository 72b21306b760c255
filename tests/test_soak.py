"""The kill -9 soak in CI: three dozen sim explorations killed at random moments and resumed.

``tests/soak.py`` holds the trials (and runs hundreds as a script); the counts are
printed at the end of the test session.
"""

from __future__ import annotations

import random

import pytest
from conftest import REPORT
from soak import OUTSIDE, soak

from ingest.faults import POINTS

TRIALS = 36


@pytest.mark.slow
def test_kill_9_soak_every_trial_resumes_to_a_sound_log(tmp_path):
    seed = random.randrange(10**6)
    try:
        tally = soak(tmp_path, TRIALS, seed)
    except AssertionError as err:
        raise AssertionError(f"soak seed {seed} (python tests/soak.py --trials {TRIALS} --seed {seed}): {err}") from err
    REPORT["soak"] = f"{tally.line()} (seed {seed})"
    assert tally.trials == TRIALS and tally.resumes >= TRIALS - 1
    assert set(POINTS) | {OUTSIDE} <= set(tally.by_moment), tally.by_moment
    assert tally.kills > TRIALS  # some resumes were killed too
    assert tally.spooled_reused > 0  # a kill at spool.renamed leaves a turn only the spool holds
