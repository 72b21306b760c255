"""Benchmark: what a real Teacher turn costs besides the model, at N concurrent turns.

Real ``opencode`` (the npm install), the scripted model server of the tests
(``tests/fake_model.py``: each agent request answered after ``--delay`` seconds; a turn
reads a note, reads a missing file, writes the solution, runs the eval and answers) and
the self-contained eval of the tests (``local-eval``). For each width N of ``--widths``
and each way of running turns (``served``: sessions of ``opencode serve`` processes, 16
turns each, the default; ``process``: an ``opencode run`` process a turn), N turn 1s of fresh
sessions from one root run at once through the backend's ``run_turn``, their requests
through the recorder. Printed per width and way: the wall time and turns per minute, and
over the turns the phases each recorded (``TurnFinished``): start-up until the first
request to the model, the model's time, and the overhead outside the model and the tools
(wall - model - tools), p50 and p95; the CPU seconds a turn of every process of the run (the
benchmark's own threads, the servers and what they ran), their utilisation of the cores (CPU
seconds / (wall x cores)) and the machine's busy share over the turns (/proc/stat: other work
too); the peak proportional set size (PSS) of every process
of the run (the server, OpenCode processes, tools, evals), in all, its fixed base (the
idle server) and per concurrent turn beyond it. A width the memory check refuses for a
way is named, not run.

Targets (issue 35): overhead p50 <= 1 s and p95 <= 3 s at 16 concurrent turns, <= 150 MB
a session beyond a fixed base, 64 concurrent turns on a 24 GB, 2-core machine.

    python benchmarks/teacher.py [--widths 1,4,16,64] [--delay 1.0] [--ways served,process] [--server-width N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import make_snapshot  # noqa: E402
from fake_model import FakeModel  # noqa: E402
from test_opencode_e2e import local_script  # noqa: E402

from engine.config import RunConfig  # noqa: E402
from engine.teachers import RootInfo, TurnRequest, check_memory, memory_available_mb, turn_memory_mb  # noqa: E402
from engine.teachers.opencode import OpenCodeTeacher  # noqa: E402
from ingest.errors import InputError  # noqa: E402
from ingest.events import TurnFinished  # noqa: E402


def pss_mb(marker: bytes) -> int:
    """The summed PSS of the live processes whose environment holds ``marker``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/smaps_rollup") as fh:
                total += sum(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except OSError:
            continue
    return total // 1024


def marked_cpu_s(marker: bytes) -> float:
    """CPU seconds the live processes whose environment holds ``marker`` used so far (with their waited children)."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        except OSError:
            continue
    return total / tick


def own_cpu_s() -> float:
    """CPU seconds of this process and its waited children (a reaped server brings its tools' with it)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine_busy() -> tuple[int, int]:
    """The machine's busy and total jiffies so far (/proc/stat)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0], ordered[0]
    return statistics.median(ordered), statistics.quantiles(ordered, n=20, method="inclusive")[18]


def width(n: int, delay: float, work: Path, serve: bool, server_width: int | None = None) -> dict[str, float]:
    """N concurrent turn 1s; their phases, wall time and peak PSS."""
    work = work / ("served" if serve else "process")
    roots = work / f"roots-{n}"
    folder = make_snapshot(roots, 1, score=1.0)
    (folder / "code" / "solution.py").write_text("VALUE = 1.0\n")
    (folder / "shared" / "notes").mkdir(exist_ok=True)
    (folder / "shared" / "notes" / "tiling.md").write_text("# Tiling\nTiles of 64 were best.\n")
    model = FakeModel(local_script).start()
    model.delay_s = delay
    options = {"model": "fake/scripted", "endpoint": model.base_url, "eval_command": "local-eval -m", "serve": serve}
    if server_width is not None:
        options["server_width"] = server_width
    config = RunConfig(task="bench", backend="opencode", backend_options=options, parallel=n)
    teacher = OpenCodeTeacher(config, work / f"run-{n}")
    marker = f"TEACHER_MCTS_RUN={(work / f'run-{n}').resolve()}".encode()
    base = 0
    if teacher.servers is not None:  # the server started and settled: the fixed base
        teacher.servers.release(*teacher.servers.acquire(None))
        time.sleep(2)
        base = pss_mb(marker)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], pss_mb(marker))

    finished: list[TurnFinished] = []
    start = teacher.root_state(RootInfo("T001", str(folder), 1.0, None))

    def turn(slot: int) -> None:
        ids = {"tree_id": "T001", "edge_id": f"T001/e{slot}-1", "parent_id": "T001", "slot": slot, "attempt": 1}
        request = TurnRequest(**ids, turn=1, start_state=start, fork=True, direction="maximize", timeout_s=900)
        finished.append(teacher.run_turn(request, threading.Event())[-1])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0 = own_cpu_s() - marked_cpu_s(marker)  # what the idle server used before is not the turns'
    busy0 = machine_busy()
    t0 = time.monotonic()
    try:
        threads = [threading.Thread(target=turn, args=(k + 1,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        wall = time.monotonic() - t0
        busy1 = machine_busy()
        done.set()
        sampler.join()
        teacher.close()
        model.stop()
    cpu = own_cpu_s() - cpu0  # the servers are reaped by now: their CPU and their tools' is in ours
    cores = len(os.sched_getaffinity(0))
    assert len(finished) == n and all(f.outcome == "completed" for f in finished), [f.error for f in finished]
    startup = quantiles([f.startup_seconds for f in finished])
    model_time = quantiles([f.model_seconds for f in finished])
    overhead = quantiles([f.wall_seconds - f.model_seconds - (f.tool_seconds or 0) for f in finished])
    return {
        "wall": wall,
        "per_minute": 60 * n / wall,
        "startup_p50": startup[0],
        "startup_p95": startup[1],
        "model_p50": model_time[0],
        "overhead_p50": overhead[0],
        "overhead_p95": overhead[1],
        "pss": peak[0],
        "base": base,
        "pss_per_turn": (peak[0] - base) / n,
        "cpu_per_turn": cpu / n,
        "utilisation": cpu / (wall * cores),
        "machine": (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="1,4,16,64", help="concurrent turns, comma-separated")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the model takes for each answer")
    parser.add_argument("--ways", default="served,process", help="served, process or both (comma-separated)")
    parser.add_argument("--server-width", type=int, default=None, help="turns one server runs (default: the backend's)")
    args = parser.parse_args()
    os.environ["PATH"] = f"{ROOT / 'tests' / 'fixtures' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    print(
        f"machine: {os.cpu_count()} cores, {memory_available_mb():,} MB available; model answers after {args.delay} s"
    )
    print(
        "way      turns  wall s  turns/min  startup p50/p95 s  model p50 s  overhead p50/p95 s"
        "  peak PSS MB  base MB  per turn MB  CPU-s/turn  util  machine"
    )
    with tempfile.TemporaryDirectory(prefix="teacher-bench-") as tmp:
        for n in (int(w) for w in args.widths.split(",")):
            for way in args.ways.split(","):
                serve = way == "served"
                per_turn = turn_memory_mb(RunConfig(task="bench", backend="opencode", backend_options={"serve": serve}))
                try:
                    check_memory(per_turn, n)
                except InputError as err:
                    print(f"{way:7s}  {n:5d}  refused by the memory check: {err}", flush=True)
                    continue
                r = width(n, args.delay, Path(tmp), serve, args.server_width)
                print(
                    f"{way:7s}  {n:5d}  {r['wall']:6.1f}  {r['per_minute']:9.1f}"
                    f"  {r['startup_p50']:7.2f} / {r['startup_p95']:6.2f}  {r['model_p50']:11.2f}"
                    f"  {r['overhead_p50']:8.2f} / {r['overhead_p95']:6.2f}  {r['pss']:11,d}  {r['base']:7,d}"
                    f"  {r['pss_per_turn']:11.0f}  {r['cpu_per_turn']:10.2f}  {r['utilisation']:4.0%}"
                    f"  {r['machine']:7.0%}",
                    flush=True,
                )
    print("targets (issue 35): overhead p50 <= 1 s, p95 <= 3 s at 16 turns; <= 150 MB a session beyond a base")


if __name__ == "__main__":
    main()
