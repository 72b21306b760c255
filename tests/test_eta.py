"""The time left of a run (run_pace.eta_seconds) as explore and watch show it, on sim runs with timed turns."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli import cli
from engine.config import RunConfig, TreeConfig
from engine.exploration import new_run
from engine.render import progress_line
from tests.conftest import SNAPSHOTS


def timed_run(data, run_id: str, parallel: int) -> list[dict]:
    """Explore 6 roots with turns of ~0.03 s; the progress row after every step of the run."""
    rows: list[dict] = []
    config = RunConfig(
        task="kernel-speedup",
        parallel=parallel,
        schedule="async",
        seed=5,
        selection={"num_roots": 6},
        tree=TreeConfig(target_good_leaves=3),
        backend_options={"latency_s": 0.03},
    )
    new_run(data, SNAPSHOTS, config, run_id, select=True, on_progress=lambda read: rows.append(read()))
    return rows


@pytest.mark.slow
def test_the_estimate_waits_for_data_is_never_zero_while_trees_remain_and_holds_the_run_s_length(data_dir):
    rows = timed_run(data_dir, "timed", parallel=6)  # the trees grow side by side
    unfinished = [r for r in rows if not r["finished"]]
    assert unfinished and rows[-1]["trees_done"] == rows[-1]["trees"] == 6
    before = [r for r in unfinished if r["trees_done"] == 0]
    assert before and all(r["eta_seconds"] is None for r in before)  # nothing to estimate from yet
    assert all(progress_line(r).endswith("| ETA estimating") for r in before)
    after = [r for r in unfinished if 0 < r["trees_done"] < r["trees"]]
    assert after, "no progress was reported between the first tree done and the run's end"
    assert all(r["eta_seconds"] is not None and r["eta_seconds"] > 0 for r in after)  # "ETA 0s" until the end
    assert all(" | ETA 0s" not in progress_line(r) for r in after)
    # Honest: from the first estimate on, it is of the order of the time the run still took (the
    # old per-tree average said 1h 26m of a run of 4 m 37 s), measured by the run's own clock.
    end = rows[-1]["last_event_at"]
    first = after[0]
    left = (end - first["last_event_at"]).total_seconds()
    assert first["eta_seconds"] < 10 * left + 1, (first["eta_seconds"], left)
    assert max(r["eta_seconds"] for r in after) < 10 * first["session_seconds"] + 1


@pytest.mark.slow
def test_watch_of_an_interrupted_run_says_it_is_not_running_instead_of_a_time_left(data_dir):
    """It said "running ... time left 0s" of a run whose writer was gone."""

    def interrupt(read) -> None:
        if read()["trees_done"] > 0:
            raise KeyboardInterrupt  # as Ctrl-C does, once the estimate has data

    config = RunConfig(
        task="kernel-speedup",
        parallel=2,
        seed=5,
        selection={"num_roots": 4},
        tree=TreeConfig(target_good_leaves=3),
        backend_options={"latency_s": 0.01},
    )
    with pytest.raises(KeyboardInterrupt):
        new_run(data_dir, SNAPSHOTS, config, "cut", select=True, on_progress=interrupt)
    r = CliRunner().invoke(cli, ["--data", str(data_dir), "watch", "cut", "--once"])
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[0]
    assert first.startswith("run cut (task kernel-speedup): not running (interrupted) | log seq ")
    assert first.endswith(" | time left none (not running)")
