"""The kill -9 soak: sim explorations killed (or signalled) at random moments, resumed, and checked.

Each trial starts ``explore`` in a process of its own and kills it with SIGKILL: at a
named moment inside a write (``ingest/faults.py``: a part written but not renamed, a
merge published but the parts it replaces not removed, a turn spooled but not in the
log, ...), the n-th time that moment comes (n drawn from how often an uninterrupted run
reaches it), or from outside once its log reached a random seq. Some trials kill the
resumed process too; some send SIGHUP, SIGTERM or SIGINT instead of the kill, and the
run must unwind with its exit code (129, 143, 130). Then ``explore --resume`` runs to
the end, and the trial checks:

- the resume completes and ``replay`` re-derives every decision with no difference;
- ``verify`` finds every part intact, and no temp file or spool is left;
- the events published before the kill are the final log's prefix, unchanged;
- no turn is recorded twice, every edge started once, judged once, and finished;
- every turn spooled at the kill is the one recorded (taken from the spool, not run again);
- in ``rounds`` mode, the trees and the turns equal those of an uninterrupted run.

The CI test (``tests/test_soak.py``) runs a few dozen trials; this script runs as many
as asked, for a longer soak on a machine of one's own::

    python tests/soak.py [--trials 300] [--seed S] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(ROOT), str(TESTS)]

from click.testing import CliRunner  # noqa: E402
from soundness import assert_log_is_sound, logical_log, tree_shape  # noqa: E402

from cli import cli  # noqa: E402
from engine.catalog import Catalog  # noqa: E402
from engine.replay import replay_run  # noqa: E402
from ingest import faults  # noqa: E402
from ingest.integrity import verify_log  # noqa: E402
from ingest.log import EventLog, run_dir  # noqa: E402

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
# Small trees of three roots: ~500 events in ~30 flushes, three merges, ~30 spooled turns.
CONFIG = "[tree]\nroot_children = 2\nmax_depth = 2\ntarget_good_leaves = 2\n"
RUN = "soak"
SETTINGS = {
    "rounds": ["--schedule", "rounds", "--parallel", "2", "--seed", "3"],
    "async": ["--schedule", "async", "--parallel", "3", "--seed", "3"],
}
OUTSIDE = "outside"  # a kill from outside at a random seq, not at a named moment
# Signals sent from outside at a random seq instead of a kill: the run unwinds (exit 128 + n).
SIGNALS = {"SIGHUP": signal.SIGHUP, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
DEADLINE_S = 600.0  # for any one process of a trial, however loaded the machine


@dataclass(frozen=True)
class Trial:
    """One kill: where (a faults point, or OUTSIDE), when, and whether the resume is killed too."""

    schedule: str
    moment: str
    arrival: int = 0  # the n-th arrival at the point (faults)
    at_seq: int = 0  # OUTSIDE: kill once the log reached this seq
    delay_s: float = 0.0  # OUTSIDE: and this long after
    again_at_seq: int = 0  # > 0: kill the resumed process too, once its log reached this seq
    signal: str = ""  # at a named moment: send this signal (a name of SIGNALS) instead of SIGKILL

    def __str__(self) -> str:
        when = f"arrival {self.arrival}" if self.arrival else f"seq {self.at_seq} +{self.delay_s:.3f} s"
        again = f", resume killed at seq {self.again_at_seq}" if self.again_at_seq else ""
        return f"{self.schedule} {self.moment} ({when}{again})"


@dataclass
class Reference:
    """An uninterrupted run of a schedule: what it grew, and how often each moment came."""

    tail: int
    reached: dict[str, int]
    shape: dict
    turns: list[tuple[str, int]]


@dataclass
class Tally:
    """Counts over the trials run (printed)."""

    trials: int = 0
    kills: int = 0
    by_moment: Counter = field(default_factory=Counter)
    turns_checked: int = 0
    spooled_reused: int = 0
    resumes: int = 0

    def line(self) -> str:
        moments = ", ".join(f"{m} {n}" for m, n in sorted(self.by_moment.items()))
        return (
            f"kill -9 soak: {self.trials} trials, {self.kills} kills ({moments}), {self.resumes} resumes "
            f"completed, replay clean, {self.turns_checked} recorded turns checked (none lost or twice), "
            f"{self.spooled_reused} spooled turns taken from the spool"
        )


class Soak:
    """Trials over one set of roots, in a scratch directory."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.roots = self.base / "roots"
        self.config = self.base / "soak.toml"
        self.config.write_text(CONFIG)
        r = CliRunner().invoke(
            cli,
            [
                "--data",
                str(self.base / "select"),
                "select-snapshots",
                str(SNAPSHOTS),
                str(self.roots),
                "--task",
                "kernel-speedup",
                "--num-roots",
                "3",
            ],
        )
        assert r.exit_code == 0, r.output
        self.references = {s: self._reference(s) for s in SETTINGS}
        self.tally = Tally()

    def _args(self, data: Path, schedule: str) -> list[str]:
        return [
            "--data",
            str(data),
            "explore",
            str(self.roots),
            "--run-id",
            RUN,
            "--config",
            str(self.config),
            *SETTINGS[schedule],
        ]

    def _reference(self, schedule: str) -> Reference:
        data = self.base / f"reference-{schedule}"
        before = faults.reached()
        r = CliRunner().invoke(cli, self._args(data, schedule))
        assert r.exit_code == 0, r.output
        reached = {p: n - before.get(p, 0) for p, n in faults.reached().items()}
        return Reference(EventLog(data, RUN).tail_seq(), reached, tree_shape(data, RUN), _turns(data))

    def plan(self, trials: int, rng: random.Random) -> list[Trial]:
        """``trials`` kills: each named moment in rounds mode, from outside in both modes, some twice.

        Of every twelve: six at the named moments (rounds), three from outside in rounds
        mode (one killing the resume too), two from outside in async mode, one at a
        named moment in async mode (within the first half of its arrivals: an async
        run's count varies).
        """
        cycle = [("rounds", p) for p in faults.POINTS] + [("rounds", OUTSIDE)] * 3 + [("async", OUTSIDE)] * 2
        cycle += [("async", "publish.written")] + [("rounds", name) for name in SIGNALS]
        out = []
        for i in range(trials):
            schedule, moment = cycle[i % len(cycle)]
            ref = self.references[schedule]
            again = self._seq(rng, ref) if moment == OUTSIDE and schedule == "rounds" and i % 12 == 8 else 0
            if moment == OUTSIDE or moment in SIGNALS:
                out.append(
                    Trial(
                        schedule, moment, at_seq=self._seq(rng, ref), delay_s=rng.uniform(0, 0.03), again_at_seq=again
                    )
                )
            else:
                top = ref.reached[moment] if schedule == "rounds" else max(1, ref.reached[moment] // 2)
                out.append(Trial(schedule, moment, arrival=rng.randint(1, top)))
        return out

    @staticmethod
    def _seq(rng: random.Random, ref: Reference) -> int:
        return rng.randint(max(2, ref.tail // 20), int(ref.tail * 0.85))

    def run(self, trial: Trial, index: int) -> None:
        """One trial: kill, resume, check (AssertionError naming the trial otherwise)."""
        data = self.base / f"trial-{index:04d}"
        try:
            self._run(trial, data)
        except AssertionError as err:
            raise AssertionError(f"trial {index} ({trial}), data kept in {data}: {err}") from err

    def _run(self, trial: Trial, data: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop(faults.CRASH_ENV, None)
        if trial.moment != OUTSIDE and trial.moment not in SIGNALS:
            env[faults.CRASH_ENV] = f"{trial.moment}:{trial.arrival}" + (f":{trial.signal}" if trial.signal else "")
        _killed(
            self._args(data, trial.schedule),
            env,
            data,
            trial.at_seq,
            trial.delay_s,
            SIGNALS.get(trial.signal or trial.moment, signal.SIGKILL),
        )
        self.tally.kills += 1
        self.tally.by_moment[trial.moment] += 1
        published = logical_log(data, RUN) if EventLog(data, RUN).exists() else []
        spooled = _spooled(data)
        if trial.again_at_seq and EventLog(data, RUN).exists():
            env.pop(faults.CRASH_ENV, None)
            again = max(trial.again_at_seq, EventLog(data, RUN).tail_seq() + 1)
            if again < self.references[trial.schedule].tail:
                _killed(["--data", str(data), "explore", "--resume", RUN], env, data, again, 0.0)
                self.tally.kills += 1
                self.tally.by_moment["outside (the resume)"] += 1
                published, spooled = logical_log(data, RUN), spooled | _spooled(data)
        if not published:  # killed before the run's first part: nothing to resume, start again
            r = CliRunner().invoke(cli, self._args(data, trial.schedule))
        else:
            r = CliRunner().invoke(cli, ["--data", str(data), "explore", "--resume", RUN])
            self.tally.resumes += 1
        assert r.exit_code == 0, f"the resume failed: {r.output[-2000:]}"
        self._check(trial, data, published, spooled)
        self.tally.trials += 1

    def _check(self, trial: Trial, data: Path, published: list[dict], spooled: dict) -> None:
        result = replay_run(data, RUN)
        assert not result.differences, f"replay differs: {result.differences[:3]}"
        found = verify_log(EventLog(data, RUN))
        assert found.ok and not found.temporary and not found.superseded, found.problem or "leftovers"
        assert not (run_dir(data, RUN) / "spool").exists(), "the spool was left behind"
        final = logical_log(data, RUN)
        assert final[: len(published)] == published, "the events published before the kill changed"
        catalog = Catalog.for_log(EventLog(data, RUN))
        assert_log_is_sound(data, RUN, catalog)
        recorded = _started_at(data)
        for key, started in spooled.items():
            assert recorded.get(key) == started, f"spooled turn {key} was run again (or lost)"
        self.tally.spooled_reused += len(spooled)
        turns = _turns(data)
        self.tally.turns_checked += len(turns)
        if trial.schedule == "rounds":
            ref = self.references["rounds"]
            assert turns == ref.turns, "the turns differ from an uninterrupted run's"
            assert tree_shape(data, RUN, catalog) == ref.shape, "the trees differ from an uninterrupted run's"


def _killed(args: list[str], env: dict, data: Path, at_seq: int, delay_s: float, signum: int = signal.SIGKILL) -> None:
    """Run ``cli.py args`` until it is killed: by itself (a faults point) or at ``at_seq`` from here.

    ``signum`` other than SIGKILL: that signal is sent instead, and the process must
    unwind and exit with 128 + its number (or have finished first: exit 0).
    """
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    log = EventLog(data, RUN)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while at_seq and proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and log.tail_seq() >= at_seq:
                time.sleep(delay_s)
                proc.send_signal(signum)
                break
            time.sleep(0.01)
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
    assert proc.returncode == expected, (
        f"the process did not end by signal {signum} (exit {proc.returncode}): {err.decode(errors='replace')[-2000:]}"
    )


def _spooled(data: Path) -> dict[tuple[str, int], str]:
    """The turns in the spool (whole files only): (edge, turn) -> when the turn started."""
    out = {}
    spool = run_dir(data, RUN) / "spool"
    for path in sorted(spool.glob("*.arrow")) if spool.is_dir() else []:
        if path.name.startswith(".tmp-"):
            continue
        with pa.ipc.open_file(path) as f:
            rows = [r for r in f.read_all().to_pylist() if r["kind"] == "turn_finished"]
        out[(rows[0]["edge_id"], rows[0]["turn"])] = rows[0]["started_at"]
    return out


def _started_at(data: Path) -> dict[tuple[str, int], str]:
    table = EventLog(data, RUN).read_table(["kind", "edge_id", "turn", "started_at"])
    return {(r["edge_id"], r["turn"]): r["started_at"] for r in table.to_pylist() if r["kind"] == "turn_finished"}


def _turns(data: Path) -> list[tuple[str, int]]:
    return sorted(_started_at(data))


def soak(base: Path, trials: int, seed: int, progress: bool = False) -> Tally:
    """Run ``trials`` trials in ``base``; the tally of a soak that passed (AssertionError otherwise)."""
    runner = Soak(base)
    for i, trial in enumerate(runner.plan(trials, random.Random(seed)), start=1):
        start = time.monotonic()
        runner.run(trial, i)
        if progress:
            print(f"trial {i}/{trials}: {trial}: ok ({time.monotonic() - start:.1f} s)", flush=True)
    return runner.tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="Seed of the plan (default: random, printed).")
    parser.add_argument("--keep", type=Path, default=None, help="Scratch directory to keep (default: a temp dir).")
    args = parser.parse_args()
    seed = random.randrange(10**6) if args.seed is None else args.seed
    print(f"kill -9 soak: {args.trials} trials, seed {seed}", flush=True)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        tally = soak(args.keep, args.trials, seed, progress=True)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tally = soak(Path(tmp), args.trials, seed, progress=True)
    print(tally.line())


if __name__ == "__main__":
    main()
