"""Command line: select snapshots, explore, replay, and read the views of a run.

Each command parses its options, makes one library call and renders the result;
the rendering for a terminal (tables, explore's progress line, a tree's drawing)
lives here. stdout carries data only; progress and warnings go to stderr. Errors
the project raises on purpose become ``Error: <message>`` with exit code 1, never
a traceback. The algorithm the commands run is explained in docs/ALGORITHM.md.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from engine import __version__
from ingest import steps
from ingest.errors import InputError, OptionError, ProjectError, os_problem
from ingest.events import as_utf8
from ingest.log import DATA_ENV, default_data_dir
from ingest.paths import command_line

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# How long the unwinding after a signal may take (stopping the turns in flight, releasing
# the log) before the process ends at once; a test sets it low through the environment.
CLEANUP_DEADLINE_S = float(os.environ.get("TEACHER_MCTS_CLEANUP_DEADLINE_S") or 120)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C (args: the signal number)."""


@contextlib.contextmanager
def _unwind_on_signals(received: list[int]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into an exception while a command runs.

    By default SIGTERM and SIGHUP end the process on the spot, so the cleanup on
    the way out never ran: the OpenCode sessions of the turns in flight (in process
    groups of their own) kept running with nobody to stop them. Raised in the main
    thread, the exception unwinds: the Teacher's processes are stopped, staged
    events are dropped (their turns are re-run by --resume), the lock is released.
    The unwinding has CLEANUP_DEADLINE_S, and a second signal ends it: either way the
    process ends at once with the first signal's message (``_exit_now``). The
    signals received are appended to ``received``: raised inside a callback
    from DuckDB (a scan of an Arrow table runs Python code), the exception comes out
    as a DuckDB error, and the caller must still report the signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    deadline: list[threading.Timer] = []  # the unwinding's, once a signal arrived

    def handler(signum: int, frame: object) -> None:
        if received:  # a second signal while unwinding: stop now (the watchdog kills what is left)
            _exit_now(received[0])
        if steps.defer(lambda: handler(signum, frame)):  # a step of the log completes first
            return
        received.append(signum)
        deadline.append(threading.Timer(CLEANUP_DEADLINE_S, _exit_now, [signum, "the cleanup did not end in time"]))
        deadline[0].daemon = True
        deadline[0].start()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    # A signal the process was started ignoring stays ignored (nohup: SIGHUP; a
    # background job of a non-interactive shell: SIGINT).
    handled = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(s) is not signal.SIG_IGN]  # fmt: skip
    previous = {s: signal.signal(s, handler) for s in handled}
    try:
        yield
    finally:  # the command has unwound: what is left is reporting the signal
        for timer in deadline:
            timer.cancel()
        for s, old in previous.items():
            signal.signal(s, old)


DATA_TYPE = click.Path(file_okay=False, path_type=Path)
DATA_HELP = f"Directory holding runs/ (default: ./data, relative to the current directory; or ${DATA_ENV})."


def _subcommand_data(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:  # given after the subcommand: it wins over the group's (and $TEACHER_MCTS_DATA)
        ctx.meta["data_dir"] = value


class _Command(click.Command):
    """A command whose text arguments must be UTF-8 (paths are checked where they are used).

    Every command takes ``--data`` too, so that it may follow the subcommand as well as
    precede it (one definition: the option is added here, not by each command).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["--data"], type=DATA_TYPE, default=None, expose_value=False,
                                        callback=_subcommand_data, help=DATA_HELP))  # fmt: skip

    def invoke(self, ctx: click.Context) -> Any:
        """Refuse a text argument that is not UTF-8 (exit 2) before the command runs.

        The log and DuckDB hold text as UTF-8; a byte that is not (Python keeps it as
        a lone surrogate) made DuckDB's binding raise inside ``sql`` (a traceback),
        and a ``--task`` so named a run that could not be read back.
        """
        for param in self.params:
            value = ctx.params.get(param.name)
            for text in value if isinstance(value, tuple) else (value,):
                if isinstance(text, str) and as_utf8(text) != text:
                    msg = f"{as_utf8(text)!r} is not UTF-8 text (shown with U+FFFD for its other bytes)"
                    raise click.BadParameter(msg, ctx=ctx, param=param)
        try:
            return super().invoke(ctx)
        except OptionError as err:  # an option's value checked where it is used: a usage error too
            raise click.UsageError(str(err), ctx) from err


class _Group(click.Group):
    """Turns ProjectError into a clean ``Error: ...`` message and exit code 1."""

    command_class = _Command

    def invoke(self, ctx: click.Context) -> Any:
        received: list[int] = []
        try:
            with _unwind_on_signals(received):
                return super().invoke(ctx)
        except Exception as err:
            if received:  # whatever the interruption turned into on its way out
                _exit_signalled(received[0])
            if isinstance(err, ProjectError):
                raise click.ClickException(str(err)) from err
            if isinstance(err, UnicodeEncodeError):  # a path no file system can name (a lone surrogate)
                raise click.UsageError(f"{as_utf8(err.object)!r} cannot be a path: it is not text the file "
                                       "system can encode") from err  # fmt: skip
            if isinstance(err, OSError) and err.errno != errno.EPIPE:  # EPIPE: click exits quietly
                raise click.ClickException(os_problem(err)) from err  # a full disk, a quota
            raise
        except (KeyboardInterrupt, Terminated):
            _exit_signalled(received[0] if received else signal.SIGINT)


def _signal_message(signum: int) -> str:
    return "Interrupted." if signum == signal.SIGINT else f"Terminated by {signal.Signals(signum).name}."


def _exit_now(signum: int, why: str | None = None) -> None:
    """End the process at once, with the message of the first signal (from any thread).

    A Teacher's processes do not outlive it: its supervisor's watchdog kills them when
    this process is gone. Staged events are not published (--resume runs their turns again).
    """
    note = f"{why}: stopped at once; continue with --resume\n" if why else ""
    os.write(2, f"{note}{_signal_message(signum)}\n".encode())
    os._exit(128 + signum)


def _exit_signalled(signum: int) -> None:
    click.echo(_signal_message(signum), err=True)
    sys.exit(128 + signum)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="teacher-mcts")
@click.option("--data", "data_dir", type=DATA_TYPE, envvar=DATA_ENV, default=None, help=DATA_HELP)
@click.pass_context
def cli(ctx: click.Context, data_dir: Path | None) -> None:
    """Token-aware MCTS data collection over an event-sourced log."""
    ctx.obj = {"data_dir": data_dir or default_data_dir()}


def _data_dir() -> Path:
    """--data as given after the subcommand, else before it, else $TEACHER_MCTS_DATA, else ./data."""
    ctx = click.get_current_context()
    return ctx.meta.get("data_dir") or ctx.find_root().obj["data_dir"]


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")

# Exit codes: a command-line option's value that no run could use (out of range, not a
# number, malformed) is a usage error, exit 2, whether click's types refuse it or the
# library does (OptionError); bad content of files and logs is exit 1 (README).
INT64 = click.IntRange(-(2**63), 2**63 - 1)
MAX_TURN_TIMEOUT_S = 7 * 86_400.0  # a week: any wait longer overflows somewhere (threading's at ~292 years)


class FiniteFloat(click.FloatRange):
    """A float in a range that is a finite number: click's FloatRange lets nan through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _run_id_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    from ingest.log import check_run_id

    try:
        return value if value is None else check_run_id(value)
    except ProjectError as err:
        raise click.BadParameter(str(err)) from err


def _parallel_option(_ctx: click.Context, _param: click.Parameter, value: int | None) -> int | None:
    from engine.config import parallel_problem

    problem = None if value is None else parallel_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(_finite(value), indent=2, default=str, allow_nan=False))


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


# ------------------------------------------------------------------ views


@cli.command()
@json_option
def views(as_json: bool) -> None:
    """List the views of the catalog with what each derives, its grain and its sources.

    \b
    Example:
        python cli.py views
    """
    from engine.catalog import read_views

    defs = read_views()
    if as_json:
        _echo_json([{"view": v.name, "summary": v.summary, "grain": list(v.grain),
                     "sources": list(v.sources), "notes": v.notes} for v in defs.values()])  # fmt: skip
        return
    for v in defs.values():
        click.echo(f"{v.name}\n    {v.summary}\n    grain: {', '.join(v.grain)}")
        click.echo(f"    sources: {', '.join(v.sources)}")


# -------------------------------------------------------- select-snapshots


@cli.command("select-snapshots")
@click.argument("all_snapshots", metavar="SOURCE", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--task", required=True, help="Task name recorded with every fact and in the copies.")
@click.option("--direction", type=click.Choice(["maximize", "minimize"]), default=None,
              help="Score direction (default: the snapshots' CORAL config, else maximize).")  # fmt: skip
@click.option("--num-roots", type=click.IntRange(min=1, max=2**63 - 1), default=30, show_default=True)
@click.option("--run-id", default=None, callback=_run_id_option, help="Id of the run to record (default: generated).")
@click.option("--overwrite", is_flag=True,
              help="Replace an earlier output in OUT (only snapshot folders are replaced).")  # fmt: skip
@json_option
def select_snapshots(all_snapshots: Path, out: Path, task: str, direction: str | None, num_roots: int,
                     run_id: str | None, overwrite: bool, as_json: bool) -> None:  # fmt: skip
    """Choose the MCTS roots of a task and copy them to OUT (docs/ALGORITHM.md, "Roots").

    SOURCE is a task's all_snapshots dir, or a CORAL run directory (every attempt
    in its .coral/public/attempts is a candidate; the picks are written out as
    snapshot folders). Every candidate is staged early, middle or late by how far
    its score got along the run's learning curve; the roots are spread over the
    stages by quota. The copies' metadata.json gain score, stage,
    selection_reason and task, which explore reads.

    \b
    Example:
        python cli.py select-snapshots data/student_run/all_snapshots data/out/roots --task demo
        python cli.py select-snapshots results/speedup/latest data/out/speedup --task speedup
    """
    from engine.roots import select_snapshots as run

    result = run(all_snapshots, out, task, _data_dir(), direction, num_roots, run_id, overwrite)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        _echo_json({
            "run_id": result.run_id, "task": result.task, "direction": result.direction,
            "num_roots": result.num_roots, "out": str(result.out), "stages": result.stages,
            "picks": [{k: p[k] for k in ("snapshot", "global_index", "agent_id", "score", "stage",
                                         "selection_reason")} for p in result.picks],
            "skipped": result.skipped, "warnings": result.warnings,
        })  # fmt: skip
        return
    click.echo(f"run {result.run_id}: task {result.task} ({result.direction}), R={result.num_roots}")
    columns = ["stage", "candidates", "eligible", "quota", "picked_quota", "fills", "picked"]
    click.echo(_table(result.stages, columns))
    click.echo(f"picked {sum(s['picked'] for s in result.stages)} snapshots -> {result.out}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped)} folders:")
        for s in result.skipped:
            click.echo(f"  {s['snapshot']}: {s['skip_reason']}")


# ---------------------------------------------------------------- explore


def _duration(seconds: float | None) -> str:
    """``1h 05m``, ``4m 12s``, ``9s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _time_left(seconds: float | None) -> str:
    """The estimate of ``run_pace``: ``estimating`` until it has data, whole seconds rounded up."""
    return "estimating" if seconds is None else _duration(math.ceil(seconds))


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def progress_line(p: dict[str, Any], running: bool = True) -> str:
    """One line of a run's progress: a ``run_progress`` row with its ``run_pace`` columns.

    ``running``: whether a process writes the run (an interrupted run has no time left).
    """
    pace = f"{p['edges_per_hour']:,.0f} edges/h" if p.get("edges_per_hour") is not None else "- edges/h"
    eta = "done" if p.get("finished") else f"ETA {_time_left(p.get('eta_seconds'))}" if running else "not running"
    return (
        f"trees {p['trees_done']}/{p['trees']} done | edges kept {p['kept_edges']} "
        f"({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, retried "
        f"{p['retried_edges']}, in flight {p['in_flight_edges']} | leaves {p['leaves']} | tool errors "
        f"{_share(p['tool_errors'], p['tool_calls'])}, knowledge {_share(p['knowledge_actions'], p['tool_calls'])} "
        f"| {pace} | {eta}"
    )


class ProgressLine:
    """explore's progress on stderr: a live line on a terminal, else a line every ``period`` s."""

    def __init__(self, period: float = 60.0) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self.period = 1.0 if self.live else period
        self.last = time.monotonic()
        self._shown = False

    def __call__(self, read: Callable[[], dict[str, Any]]) -> None:
        now = time.monotonic()
        if now - self.last < self.period:
            return
        self.last = now
        line = progress_line(read())
        if self.live:  # one line, rewritten in place
            width = self.console.width
            self.console.file.write("\r\033[K" + (line if len(line) < width else line[: width - 1]))
            self.console.file.flush()
            self._shown = True
        else:
            self.console.print(line)

    def close(self) -> None:
        if self._shown:
            self.console.file.write("\n")
            self.console.file.flush()


RESUMABLE = ("parallel", "turn_timeout")  # how the run is deployed, not what it decides (DECISIONS.md)
OPENCODE_OPTIONS = {"model": "model", "endpoint": "endpoint", "api_key_env": "api_key_env",
                    "eval_command": "eval_command", "turn_timeout": "turn_timeout_s",
                    "worktrees": "worktree_root", "coral_dir": "coral_dir"}  # fmt: skip


def _explore_overrides(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {k: kw[k] for k in ("backend", "parallel", "schedule", "seed", "direction", "task")
                           if kw.get(k) is not None}  # fmt: skip
    if kw.get("num_roots") is not None:
        out["selection"] = {"num_roots": kw["num_roots"]}
    backend = {opt: kw[key] for key, opt in OPENCODE_OPTIONS.items() if kw.get(key) is not None}
    if kw.get("no_grader_check"):
        backend["grader_check"] = False
    if backend:
        out["backend_options"] = backend
    return out


@cli.command()
@click.argument("roots", type=click.Path(path_type=Path), required=False)
@click.option("--run-id", default=None, callback=_run_id_option, help="Id of the new run (default: generated).")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="Continue an interrupted run from its log.")  # fmt: skip
@click.option("--backend", type=click.Choice(["sim", "opencode"]), default=None,
              help="Teacher backend (default sim).")  # fmt: skip
@click.option("--parallel", type=click.IntRange(min=1), default=None, callback=_parallel_option,
              help="Teacher slots shared by all trees (default 4; at most 4096, or half of ulimit -u).")  # fmt: skip
@click.option("--schedule", type=click.Choice(["rounds", "async"]), default=None,
              help="rounds: batches, reproducible (default for sim); async: a free slot is refilled "
                   "at once (default for opencode).")  # fmt: skip
@click.option("--seed", type=INT64, default=None, help="Seed of the run (default 0).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML file with run configuration.")  # fmt: skip
@click.option("--select", "select", is_flag=True,
              help="ROOTS is an all_snapshots dir or CORAL run: select the roots first (needs --task).")  # fmt: skip
@click.option("--task", default=None,
              help="Task name (default: the one the roots were selected for; needed with --select).")  # fmt: skip
@click.option("--direction", type=click.Choice(["maximize", "minimize"]), default=None)
@click.option("--num-roots", type=click.IntRange(min=1, max=2**63 - 1), default=None,
              help="Roots to select with --select (default 30).")  # fmt: skip
@click.option("--model", default=None, help="opencode: provider/model.")
@click.option("--endpoint", default=None, help="opencode: OpenAI-compatible base URL (.../v1).")
@click.option("--api-key-env", default=None, help="opencode: variable holding the API key.")
@click.option("--eval-command", default=None, help='opencode: eval command (default "coral eval -m").')
@click.option("--turn-timeout", type=FiniteFloat(min=0, min_open=True, max=MAX_TURN_TIMEOUT_S), default=None,
              help="opencode: seconds per turn (at most a week).")  # fmt: skip
@click.option("--worktrees", default=None, help="opencode: where worktrees go (default: in the run).")
@click.option("--coral-dir", default=None,
              help="opencode: the Student run's .coral; every edge gets a CORAL run of its own, graded by "
                   "CORAL's daemon (the Student run is only read).")  # fmt: skip
@click.option("--no-grader-check", is_flag=True, default=None,
              help="opencode with --coral-dir: do not grade a root's own code before the first turn.")  # fmt: skip
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where turns run: this machine, or the workers of a Ray cluster.")  # fmt: skip
@click.option("--ray-address", default=None,
              help="With --executor ray: the cluster to join (default $RAY_ADDRESS, else a local one).")  # fmt: skip
@json_option
def explore(roots: Path | None, run_id: str | None, resume_id: str | None, config_file: Path | None,
            select: bool, executor: str, ray_address: str | None, as_json: bool, **options: Any) -> None:  # fmt: skip
    """Grow the token-aware MCTS trees of every root (docs/ALGORITHM.md, "Trees").

    ROOTS is the output of select-snapshots (or, with --select, a task's
    all_snapshots dir or CORAL run). Progress goes to stderr; the summary to stdout: per tree
    its kept edges (kept_exempt ones included), leaves, stop, and its paths:
    candidate root-to-leaf paths, ranked (every node has a score and every edge a
    knowledge value, so the path can be ranked), selected (in the Top-k).

    With --backend opencode and --coral-dir (the Student run's .coral), every
    edge gets a CORAL run of its own and CORAL's grader daemon runs beside each
    turn, so that CORAL's coral eval grades in the edge's worktree.

    \b
    Example:
        python cli.py explore data/out/roots --run-id demo
        python cli.py explore --resume demo
        python cli.py explore data/out/speedup --backend opencode --model sglang/qwen \\
            --endpoint http://127.0.0.1:30000/v1 --coral-dir results/speedup/latest/.coral
        python cli.py explore data/out/roots --run-id big --executor ray --ray-address auto
    """
    from engine.config import load_config
    from engine.exploration import new_run, resume_run

    if ray_address and executor != "ray":
        raise click.UsageError("--ray-address needs --executor ray")
    progress = ProgressLine()
    try:
        if resume_id:
            if roots is not None or run_id or select:
                raise click.UsageError("--resume takes no ROOTS, --run-id or --select")
            fixed = [f"--{name.replace('_', '-')}" for name, value in options.items()
                     if value is not None and name not in RESUMABLE]  # fmt: skip
            fixed += ["--config"] if config_file else []
            if fixed:
                raise click.UsageError(f"--resume continues the run as its log records it: {', '.join(fixed)} "
                                       "cannot change (the run keeps its recorded value); a resume may change "
                                       "only --parallel, --turn-timeout, --executor and --ray-address")  # fmt: skip
            result = resume_run(_data_dir(), resume_id, progress, lambda p: _resuming(resume_id, p),
                                executor, ray_address, options["parallel"], options["turn_timeout"])  # fmt: skip
        else:
            if roots is None:
                raise click.UsageError("ROOTS is required (or --resume RUN_ID)")
            if select and not options.get("task"):
                raise click.UsageError("--select needs --task")
            config = load_config(config_file, _explore_overrides(**options))

            def started(rid: str) -> None:
                hint = command_line(_data_dir(), "explore", "--resume", rid)
                click.echo(f"run {rid}: exploring (interrupt and continue with: {hint})", err=True)

            try:
                result = new_run(_data_dir(), roots, config, run_id, select, progress, started, executor,
                                 ray_address)  # fmt: skip
            except InputError as err:  # about the folders of ROOTS: they may be ones to select from
                if select or not roots.is_dir() or not str(err).startswith(f"{roots}: "):
                    raise
                raise InputError(f"{err} (ROOTS is the output of select-snapshots; to select the roots "
                                 "from a task's all_snapshots dir or a CORAL run first, add --select "
                                 "--task NAME)") from err  # fmt: skip
    finally:
        progress.close()
    _render_explore(result, as_json)


def _resuming(run_id: str, p: dict[str, Any]) -> None:
    if p["finished"]:
        click.echo(f"run {run_id}: finished already ({p['trees_done']}/{p['trees']} trees done)", err=True)
        return
    click.echo(f"run {run_id}: resuming task {p['task']}: {p['trees_done']}/{p['trees']} trees done, "
               f"{p['kept_edges']} edges kept, {p['in_flight_edges']} edges in flight", err=True)  # fmt: skip


EXPLORE_COLUMNS = ["tree_id", "stage", "root_score", "best_score", "kept_edges", "good_leaves",
                   "final_leaves", "stop_reason", "paths", "ranked", "selected", "top_path_score"]  # fmt: skip


def _render_explore(result: Any, as_json: bool) -> None:
    if as_json:
        _echo_json({"run_id": result.run_id, "progress": result.progress, "trees": result.trees})
        return
    p = result.progress
    click.echo(
        f"run {result.run_id}: {p['trees_done']}/{p['trees']} trees done; edges kept "
        f"{p['kept_edges']} ({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, "
        f"retried {p['retried_edges']}; leaves {p['leaves']}"
    )
    click.echo(_table(result.trees, EXPLORE_COLUMNS))
    selected = sum(t["selected"] for t in result.trees)
    click.echo(f"Top-{result.top_k}: {selected} paths selected over {len(result.trees)} roots "
               f"({command_line(_data_dir(), 'paths', result.run_id)})")  # fmt: skip


# ------------------------------------------------------------ replay, paths


REPLAY_COLUMNS = ["tree_id", "nodes", "kept_edges", "kept_exempt_edges", "pruned_edges", "retried_edges",
                  "depth_leaves", "token_leaves", "exhausted_leaves", "stopped_leaves", "stop_reason",
                  "best_score"]  # fmt: skip


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option("--tree", "tree_id", default=None, help="Draw this tree of the one run named (with --json: its lines).")
@json_option
def replay(run_ids: tuple[str, ...], tree_id: str | None, as_json: bool) -> None:
    """Rebuild every tree from the log and re-derive every recorded decision.

    One run: its trees, the differences and a count. Several runs (default: every
    run under --data): a line per run as it is checked, the differences, a total.
    Exit code 1 when any recorded decision differs from what the log prefix it saw
    implies; each difference is listed.

    \b
    Example:
        python cli.py replay demo
        python cli.py replay demo --tree T003
        python cli.py --data /data/collection replay
    """
    from engine.replay import replay_run

    if len(run_ids) != 1:
        if tree_id:
            raise click.UsageError("--tree draws a tree of one run: name exactly one RUN_ID")
        _replay_collection(list(run_ids), as_json)
        return
    run_id = run_ids[0]
    result = replay_run(_data_dir(), run_id)
    differ = len(result.differences)
    lines = draw_tree(result.catalog, tree_id) if tree_id else []
    if tree_id and not lines:  # before any output: the report is whole or not printed
        raise click.ClickException(f"run {run_id!r} has no tree {tree_id!r}")
    if as_json:
        _echo_json({
            "run_id": run_id, "decisions": result.decisions, "differ": differ,
            "trees": result.trees, "differences": [vars(d) for d in result.differences],
            **({"drawing": {"tree_id": tree_id, "lines": lines}} if tree_id else {}),
        })  # fmt: skip
    else:
        click.echo(_table(result.trees, REPLAY_COLUMNS))
        if tree_id:
            click.echo(f"\ntree {tree_id} (* = on a selected path, x = attempt without a node)")
            click.echo("\n".join(lines))
        for d in result.differences:
            click.echo(_difference_line(d))
        click.echo(f"replay: {result.decisions} decisions re-derived, {differ} differ")
    if differ:
        sys.exit(1)


def _replay_collection(run_ids: list[str], as_json: bool) -> None:
    """Replay several runs (every run under --data when none is named), in run order, a run per core at once."""
    from engine.replay import replay_runs
    from engine.runs import runs_to_read

    data_dir = _data_dir()
    run_ids, damaged = runs_to_read(data_dir, run_ids)
    results, decisions, differ = [], 0, 0
    for result in replay_runs(data_dir, run_ids):
        decisions += result.decisions
        differ += len(result.differences)
        if as_json:
            results.append({"run_id": result.run_id, "decisions": result.decisions,
                            "differ": len(result.differences), "trees": result.trees,
                            "differences": [vars(d) for d in result.differences]})  # fmt: skip
            continue
        click.echo(f"run {result.run_id}: {len(result.trees)} trees, {result.decisions} decisions re-derived, "
                   f"{len(result.differences)} differ")  # fmt: skip
        for d in result.differences:
            click.echo("  " + _difference_line(d))
    if as_json:
        _echo_json({"runs": results, "decisions": decisions, "differ": differ})
    else:
        runs = f"{len(run_ids)} run{'s' if len(run_ids) != 1 else ''}"
        click.echo(f"replay: {runs}, {decisions} decisions re-derived, {differ} differ")
    _name_damaged(damaged)
    if differ:
        sys.exit(1)


def _difference_line(d: Any) -> str:
    return (f"decision {d.seq if d.seq is not None else '-'} {d.kind} {d.subject}: "
            f"{d.problem}; recorded: {d.recorded or '-'}; log implies: {d.derived or '-'}")  # fmt: skip


def draw_tree(catalog: Any, tree_id: str) -> list[str]:
    """Lines drawing one tree: node, score, soft, tok, verdict, leaf reason, selected paths."""
    nodes = catalog.query(
        "select n.node_id, n.depth, n.score, n.tok, n.leaf_reason, e.soft, e.verdict "
        "from nodes as n left join edges as e on e.tree_id = n.tree_id and e.edge_id = n.edge_id "
        "where n.tree_id = ? order by node_key(n.node_id)", [tree_id],
    )  # fmt: skip
    if not nodes:
        return []
    on_path = {n for row in catalog.query("select node_ids from top_paths where tree_id = ?", [tree_id])
               for n in row["node_ids"]}  # fmt: skip
    failed: dict[str, list[str]] = {}
    for f in catalog.query("select parent_id, edge_id, verdict from edges where tree_id = ? and child_id is null "
                           "order by started_seq", [tree_id]):  # fmt: skip
        failed.setdefault(f["parent_id"], []).append(f"{f['edge_id']} {f['verdict'] or 'in flight'}")
    lines = []
    for n in nodes:
        indent = "  " * n["depth"]
        mark = "*" if n["node_id"] in on_path else " "
        parts = [f"{indent}{mark} {n['node_id']}", f"score {_num(n['score'])}", f"tok {n['tok']}"]
        if n["depth"]:
            parts += [f"soft {_num(n['soft'])}", n["verdict"]]
        if n["leaf_reason"]:
            parts.append(f"leaf: {n['leaf_reason']}")
        lines.append("  ".join(parts))
        lines += [f"{indent}    x {f}" for f in failed.get(n["node_id"], [])]
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


PATH_COLUMNS = ["tree_id", "leaf_id", "rank", "path_score", "max_score", "max_score_rank", "avg_score",
                "avg_score_rank", "avg_cleanliness", "avg_knowledge", "task", "stage", "snapshot"]  # fmt: skip


@cli.command()
@click.argument("run_id")
@click.option("--tree", "tree_id", default=None, help="Only this tree.")
@click.option("--selection", "selection", default=None,
              help="A recorded selection id (default: the run's default selection).")  # fmt: skip
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
def paths(run_id: str, tree_id: str | None, selection: str | None, as_json: bool, as_csv: bool) -> None:
    """Print the selected root-to-leaf paths of a run with their fields (docs/ALGORITHM.md, "Paths").

    A path is ranked when every node on it has a score and every edge a knowledge
    value; the Top-k ranked paths of each root by PathScore are selected.

    \b
    Example:
        python cli.py paths demo --tree T001
        python cli.py paths demo --csv > paths.csv
    """
    from engine.selections import selected_paths

    if as_json and as_csv:
        raise click.UsageError("--json cannot be used with --csv")
    chosen, rows = selected_paths(_data_dir(), run_id, selection, tree_id)
    if as_json:
        _echo_json({"selection_id": chosen["selection_id"], "weights": chosen["weights"],
                    "top_k": chosen["top_k"], "paths": rows})  # fmt: skip
        return
    if as_csv:
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow([*PATH_COLUMNS, "node_ids"])
        for r in rows:
            writer.writerow([r.get(c) for c in PATH_COLUMNS] + [" ".join(r["node_ids"])])
        return
    click.echo(f"selection {chosen['selection_id']}: weights {chosen['weights']}, top-{chosen['top_k']}")
    click.echo(_table(rows, PATH_COLUMNS[:-1]))


@cli.command()
@click.argument("run_id")
@click.option("--weights", default=None, metavar="max=W,avg=W,clean=W,know=W",
              help="PathScore weights (missing keys keep the run's; each within +-1e6, not all 0).")  # fmt: skip
@click.option("--top-k", type=click.IntRange(min=1, max=2**63 - 1), default=None,
              help="Paths per root (default: the run's).")  # fmt: skip
@click.option("--diversity", "diversity", type=FiniteFloat(min=0, max=1e6), default=None, metavar="LAMBDA",
              help="Pick each root's paths greedily by PathScore + LAMBDA x the N_eff each adds "
                   "(0 to 1e6).")  # fmt: skip
@json_option
def reselect(run_id: str, weights: str | None, top_k: int | None, diversity: float | None, as_json: bool) -> None:
    """Select paths again with other weights, k or diversity, from the same log (no rollout re-run).

    The selection is appended as a decision whose id follows from its parameters;
    the same parameters again append nothing. With --diversity the Top-k of each
    root are picked one by one, each time the path with the highest PathScore plus
    LAMBDA times the lineage-aware count it adds to those already picked
    (docs/ALGORITHM.md, "Paths"); per root and overall, N_eff/N and the mean
    PathScore are shown beside the default selection's.

    \b
    Example:
        python cli.py reselect demo --weights max=0.5,avg=0.2,clean=0.15,know=0.15 --top-k 4
        python cli.py reselect demo --diversity 0.5
    """
    from engine.selections import reselect as run

    result = run(_data_dir(), run_id, weights, top_k, diversity)
    sel = result.selection
    if as_json:
        _echo_json({"selection_id": sel["selection_id"], "appended": result.appended,
                    "weights": sel["weights"], "top_k": sel["top_k"], "paths": sel["paths"],
                    "compared_with": result.default_id, "paths_in": result.added,
                    "paths_out": result.removed, "comparison": result.comparison})  # fmt: skip
        return
    state = "appended" if result.appended else "already recorded"
    click.echo(f"selection {sel['selection_id']} ({state}): weights {sel['weights']}, top-{sel['top_k']}")
    click.echo(_table(sel["paths"], ["tree_id", "leaf_id", "rank", "path_score"]))
    if result.default_id:
        click.echo(f"versus the default selection {result.default_id}: "
                   f"{len(result.added)} paths in, {len(result.removed)} out")  # fmt: skip
        for tree in sorted({p["tree_id"] for p in result.added + result.removed}):
            ins = [p["leaf_id"] for p in result.added if p["tree_id"] == tree]
            outs = [p["leaf_id"] for p in result.removed if p["tree_id"] == tree]
            click.echo(f"  {tree}: in {', '.join(ins) or '-'}; out {', '.join(outs) or '-'}")
        if sel["weights"].get("diversity") is not None:
            click.echo("N_eff/N and mean PathScore, default -> this selection:")
            click.echo(_table(result.comparison, ["tree_id", "n_eff_ratio_default", "n_eff_ratio",
                                                  "mean_path_score_default", "mean_path_score"]))  # fmt: skip


# ------------------------------------------------------------------ watch

WIDE = 100  # a terminal narrower than this gets plain lines


def _frame_header(frame: Any) -> list[str]:
    p, pace = frame.progress, frame.pace
    state = "finished" if frame.finished else "running" if frame.writing else "not running (interrupted)"
    stops = ", ".join(f"{reason} {n}" for reason, n in frame.stops.items()) or "none yet"
    now = datetime.now(UTC)
    oldest = min((t["since"] for t in frame.in_flight if t["since"]), default=None)
    eta = "none" if frame.finished else _time_left(pace["eta_seconds"]) if frame.writing else "none (not running)"
    rate = lambda key: "-" if pace[key] is None else f"{pace[key]:,.0f}"  # noqa: E731
    return [
        f"run {frame.run_id} (task {frame.task}): {state} | log seq {frame.seq} | session "
        f"{_duration(pace['session_seconds'])} | time left {eta}",
        f"trees  {p['trees']}: {p['trees_done']} done, {p['trees_running']} active; stopped by: {stops}",
        f"edges  kept {p['kept_edges']} ({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, "
        f"retried {p['retried_edges']}, in flight {p['in_flight_edges']} | leaves {p['leaves']}",
        f"turns  in flight {len(frame.in_flight)}"
        + (f" (the oldest for {_duration((now - oldest).total_seconds())})" if oldest else ""),
        f"tools  {p['tool_calls']} calls, {_share(p['tool_errors'], p['tool_calls'])} errors, "
        f"{_share(p['knowledge_actions'], p['tool_calls'])} knowledge actions",
        f"pace   {rate('edges_per_hour')} edges/h, {rate('tokens_per_hour')} tokens/h",
    ]


def _frame_view(frame: Any, height: int) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("tree", "stage", "status", "stop", "kept", "leaves", "in flight", "root", "best", "gain"):
        table.add_column(column, justify="right" if column not in ("tree", "stage", "status", "stop") else "left")
    shown = frame.trees[: max(3, height - 10)]
    for t in shown:
        gain = None if t["best_score"] is None or t["root_score"] is None else t["best_score"] - t["root_score"]
        table.add_row(t["tree_id"], t["stage"] or "-", t["status"], t["stop_reason"] or "-", str(t["kept_edges"]),
                      str(t["final_leaves"] or t["good_leaves"]), str(t["in_flight_edges"]), _fmt(t["root_score"]),
                      _fmt(t["best_score"]), "-" if gain is None else f"{gain:+.4f}")  # fmt: skip
    lines = [Text(line) for line in _frame_header(frame)]
    more = len(frame.trees) - len(shown)
    tail = [Text(f"... and {more} more trees")] if more else []
    return Group(*lines, Text(""), table, *tail)


@cli.command()
@click.argument("run_id")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--period", type=FiniteFloat(min=0.2, max=3600), default=5.0, show_default=True,
              help="Seconds between looks at the log when no new part is noticed.")  # fmt: skip
def watch(run_id: str, once: bool, period: float) -> None:
    """Watch a run as another process writes it, until it finishes.

    Trees done and active and why they stopped, edges by verdict, leaves, each tree's
    best score against its root's, the turns in flight and for how long, tool-error
    and knowledge-action rates, edges and tokens per hour and the time left. Only
    whole log parts are read, so every frame is a consistent prefix of the run. On a
    terminal narrower than 100 columns, or a pipe, it prints a line per change.

    \b
    Example:
        python cli.py watch demo
        python cli.py watch demo --once
    """
    from rich.console import Console
    from rich.live import Live

    from engine.watch import follow

    console = Console(highlight=False)
    rich_view = console.is_terminal and console.width >= WIDE
    frames = follow(_data_dir(), run_id, period)
    if once:
        frame = next(frames)
        if rich_view:
            console.print(_frame_view(frame, console.height))
        else:
            click.echo("\n".join(_frame_header(frame)))
        return
    if rich_view:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for frame in frames:
                live.update(_frame_view(frame, console.height), refresh=True)
        return
    last = None
    for frame in frames:
        if frame.seq != last or frame.finished:
            click.echo(f"{frame.run_id} seq {frame.seq}: " + progress_line(frame.progress | frame.pace, frame.writing))
            last = frame.seq


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The HTML file to write.")  # fmt: skip
def report(run_ids: tuple[str, ...], out: Path) -> None:
    """Write one self-contained HTML report of runs (default: every run under --data).

    Every tree drawn (nodes coloured by score against the root, verdicts, leaf
    reasons, the selected paths; hover or click for the details), the stage coverage
    of roots and selected paths, N_eff/N and the N_eff(N) curve, tool-error and
    knowledge-action rates, tokens and cost per root; for several runs, an overview
    first. The file needs nothing from the network to open.

    \b
    Example:
        python cli.py report demo --out report.html
    """
    from engine.collection import open_runs
    from engine.report import write_report
    from ingest.paths import outside_data

    outside_data(out, _data_dir(), "the report")
    runs = open_runs(_data_dir(), list(run_ids) or None)
    size = write_report(runs, out)
    click.echo(f"wrote {out} ({size / 1024:,.0f} KiB)", err=True)
    _name_damaged(runs.damaged)


# ------------------------------------------------------------ sql, audit


def _runs_and(args: tuple[str, ...], what: str) -> tuple[list[str], str]:
    if not args:
        raise click.UsageError(f"{what} is required")
    return list(args[:-1]), args[-1]


def _write_rows(rows: list[dict[str, Any]], as_json: bool, as_csv: bool) -> None:
    if as_json:
        _echo_json(rows)
    elif as_csv:
        import csv

        writer = csv.writer(sys.stdout)
        columns = list(rows[0]) if rows else []
        writer.writerow(columns)
        for r in rows:
            writer.writerow([_csv_cell(r[c]) for c in columns])
    else:
        click.echo(_table(rows, list(rows[0]) if rows else []))


def _csv_cell(value: Any) -> Any:
    return json.dumps(value, default=str) if isinstance(value, list | dict) else value


@cli.command("sql")
@click.argument("args", nargs=-1, metavar="[RUN_ID ...] QUERY")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@click.option("--parquet", "parquet", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the result to this Parquet file instead (never among the runs of --data).")  # fmt: skip
@click.option("--overwrite", is_flag=True, help="With --parquet: replace an existing file.")
@click.option("--memory-limit", "memory_limit", default=None, metavar="SIZE",
              help="Memory the query may take beyond the loaded runs' (default 4GB, or $TEACHER_MCTS_SQL_MEMORY).")
@click.option("--timeout", "timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds the query may run (default 300, or $TEACHER_MCTS_SQL_TIMEOUT_S).")  # fmt: skip
def sql_command(args: tuple[str, ...], as_json: bool, as_csv: bool, parquet: Path | None, overwrite: bool,
                memory_limit: str | None, timeout: float | None) -> None:  # fmt: skip
    """Run a read-only SQL query over the views of runs (default: every run under --data).

    Every view is the union of the runs' rows, run_id first (`python cli.py views` lists
    them). Only a query is run: one SELECT (or EXPLAIN of one) - statements that write,
    attach, install, load or set, EXPLAIN ANALYZE, and reads of files outside the runs'
    logs are refused and nothing is run or written. A query past its memory or time
    limit is stopped. Without RUN_IDs, a damaged run is left out and named (exit 1).

    \b
    Example:
        python cli.py sql "select run_id, stratum_key as stage, n_eff_ratio from coverage where stratum = 'stage'"
        python cli.py sql demo "select * from edges where verdict = 'pruned'" --csv > pruned.csv
    """
    from engine.collection import Limits, open_runs, parquet_target, read_only, write_parquet

    if sum(map(bool, (as_json, as_csv, parquet))) > 1:
        raise click.UsageError("--json, --csv and --parquet go one at a time")
    if overwrite and parquet is None:
        raise click.UsageError("--overwrite goes with --parquet")
    runs, query = _runs_and(args, "QUERY")
    limits = Limits.resolve(memory_limit, timeout)
    read_only(query)  # refused before any run is read
    if parquet is not None:
        parquet_target(parquet, _data_dir(), overwrite)
    collection = open_runs(_data_dir(), runs or None, limits)
    if parquet is None:
        _write_rows(collection.query(query), as_json, as_csv)
    else:
        rows = write_parquet(collection.arrow(query), parquet, _data_dir(), overwrite)
        click.echo(f"wrote {rows} rows to {parquet}", err=True)
    _name_damaged(collection.damaged)


def _name_damaged(damaged: list[Any]) -> None:
    """After an all-runs command's output: name each damaged run it left out (stderr), and exit 1."""
    for run in damaged:
        click.echo(f"Error: {run.message()}", err=True)
    if damaged:
        sys.exit(1)


def _parse_by(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...]:
    from engine.audit import parse_by

    try:
        return parse_by(value)
    except ProjectError as err:
        raise click.BadParameter(str(err).removeprefix("--by: ")) from err


@cli.command("audit")
@click.argument("run_ids", nargs=-1)
@click.option("--by", "by", default="task,stage", callback=_parse_by, show_default=True,
              help="Strata of the coverage table: any of task, stage, depth, lineage, root.")  # fmt: skip
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print the coverage table as CSV.")
def audit_command(run_ids: tuple[str, ...], by: tuple[str, ...], as_json: bool, as_csv: bool) -> None:
    """Audit runs (default: every run under --data): coverage, N_eff/N, learnability, tools, cost.

    The coverage table gives per stratum the roots, candidate, ranked and selected
    paths, edges by verdict and N_eff/N, the selected paths' independent share
    (docs/ALGORITHM.md, "Coverage"). Roots whose kept edges always or never improve
    are flagged. Exit 1 when any audit_* view has rows: each is listed.

    \b
    Example:
        python cli.py audit demo --by task,stage,depth
    """
    from engine.audit import audit

    if as_json and as_csv:
        raise click.UsageError("--json cannot be used with --csv")
    report = audit(_data_dir(), list(run_ids) or None, by)
    if as_json:
        _echo_json({"runs": report.runs, **report.tables()})
    elif as_csv:
        _write_rows(report.coverage, False, True)
    else:
        _render_audit(report)
    _name_damaged(report.damaged)
    if report.violations:
        sys.exit(1)


COVERAGE_COLUMNS = ["run_id", "stratum", "stratum_key", "roots", "candidate_paths", "ranked_paths",
                    "selected_paths", "n_eff", "n_eff_ratio", "kept_edges", "kept_exempt_edges",
                    "pruned_edges", "retried_edges", "quota_fill"]  # fmt: skip


def _render_audit(report: Any) -> None:
    click.echo(f"audit of {len(report.runs)} run(s): {', '.join(report.runs)}")
    sections = (
        ("coverage (N_eff/N: how independent the selected paths are)", report.coverage, COVERAGE_COLUMNS),
        ("roots outside the learnability band (kept edges always or never improve)", report.learnability,
         ["run_id", "tree_id", "stage", "kept_edges", "improved_edges", "band"]),
        ("most frequent tool errors", report.tool_errors, ["run_id", "errors", "share", "message"]),
        ("tool-error rate by tool", report.tool_error_rates, ["run_id", "key", "calls", "errors", "error_rate"]),
        ("knowledge actions", report.knowledge, ["run_id", "area", "access", "actions", "edges"]),
        ("improvement with and without knowledge actions", report.knowledge_improvement,
         ["run_id", "task", "measure", "with_knowledge", "edges", "improved", "improved_rate"]),
        ("cost per task", report.cost, ["run_id", "task", "roots", "turns", "tokens", "cost", "selected_paths",
                                        "tokens_per_selected_path"]),
    )  # fmt: skip
    for title, rows, columns in sections:
        click.echo(f"\n{title}:")
        click.echo(_table(rows, columns) if rows else "  (none)")
    if report.violations:
        click.echo(f"\n{len(report.violations)} violation(s):")
        for v in report.violations:
            click.echo(f"  {v['run_id']} {v['kind']} {v['subject']}: {v['problem']}; recorded: "
                       f"{v['recorded'] or '-'}; derived: {v['derived'] or '-'}")  # fmt: skip
    else:
        click.echo("\naudit: no violations")


def _workspace_option(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not value.startswith("/") or len(value) < 2:
        raise click.BadParameter(f"must be an absolute directory path, not {value!r}")
    return value


@cli.command("export")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID ...]")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write (new or empty).")
@click.option("--selection", default=None, help="A recorded selection id (default: each run's default selection).")
@click.option("--format", "fmt", type=click.Choice(["chat", "atif"]), default="chat", show_default=True,
              help="chat: OpenAI messages and tools (SFT trainers); atif: ATIF v1.4 trajectories.")  # fmt: skip
@click.option("--task", default=None, help="Only paths of this task.")
@click.option("--stage", type=click.Choice(["early", "middle", "late"]), default=None,
              help="Only paths whose root is of this stage.")  # fmt: skip
@click.option("--workspace", default="/workspace", show_default=True, callback=_workspace_option,
              help="The path that replaces every worktree directory in the samples.")  # fmt: skip
@click.option("--no-reasoning", "no_reasoning", is_flag=True, help="Leave out the model's reasoning text.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out.")
@click.option("--invalid-calls", "invalid", type=click.Choice(["keep", "drop"]), default="keep", show_default=True,
              help="Keep or leave out the samples holding a call of a tool the model was not offered "
                   "(OpenCode re-sends it as a call of 'invalid'; metadata.invalid_calls marks them).")  # fmt: skip
@click.option("--tokenizer", default=None, type=click.Path(exists=True, file_okay=False),
              help="A local Hugging Face tokenizer directory: the manifest gives each sample's tokens "
                   "as its chat template renders it (needs the train extra).")  # fmt: skip
@json_option
def export(run_ids: tuple[str, ...], out: Path, selection: str | None, fmt: str, task: str | None,
           stage: str | None, workspace: str, no_reasoning: bool, overwrite: bool, invalid: str,
           tokenizer: str | None, as_json: bool) -> None:  # fmt: skip
    """Export the selected paths of runs as a training set: one sample per path.

    Each sample is the conversation the model had along the path, root to leaf
    (system prompt, each turn's prompt, its messages, tool calls and results), with
    the path's fields, its nodes' scores and tokens and its turns' eval results.
    Without RUN_IDs, every run with a path selection. One JSONL file per run, and
    manifest.json (selection, weights, log tails, counts, sha256 of each file).

    \b
    Example:
        python cli.py export demo --out data/out/train
        python cli.py export demo --format atif --stage late --out data/out/late-atif
    """
    from engine.export import export_runs

    result = export_runs(_data_dir(), list(run_ids), out, selection, fmt, task, stage, workspace,
                         not no_reasoning, overwrite, invalid, tokenizer)  # fmt: skip
    m = result.manifest
    if as_json:
        _echo_json({"out": str(result.out), **m})
    else:
        for run in m["runs"]:
            click.echo(f"run {run['run_id']}: selection {run['selection_id']}, {run['samples']} samples -> "
                       f"{run['file']}")  # fmt: skip
        counts = ", ".join(f"{t} {s} {n}" for t, stages in m["counts"].items() for s, n in stages.items())
        click.echo(f"{m['samples']} {m['format']} samples ({counts}) in {result.out}")
        flagged = sum(r["invalid_call_samples"] for r in m["runs"])
        if flagged:
            what = "left out" if invalid == "drop" else "kept; --invalid-calls drop leaves them out"
            click.echo(f"{flagged} samples hold a call of a tool the model was not offered ({what})")
        longest = f", {m['max_tokens']} tokens" if "max_tokens" in m else ""
        click.echo(f"longest sample: {m['max_chars']} characters{longest} (a trainer's max_length must hold it)")
    _name_damaged(result.damaged)


# ------------------------------------------------------- verify, quarantine


def _part_row(c: Any) -> dict[str, Any]:
    return {"part": c.name, "first": c.first, "last": c.last, "level": c.level, "checksum": c.checksum,
            "problem": c.problem}  # fmt: skip


@cli.command()
@click.argument("run_id")
@json_option
def verify(run_id: str, as_json: bool) -> None:
    """Read every byte of every part of a run's log and report the first damaged one.

    The run's record of its parts must be whole; each part it names must match the
    checksum its name records, have a footer that agrees with the log, decode page
    by page, hold exactly the seqs its name says and only this run's events; the
    parts must cover 1..tail without a gap; no other file may lie in log/ (a file
    copied in is listed as FOREIGN: nothing reads it). Exit 1 when anything is
    wrong: the report names the part or file, its seq range and the intact prefix.
    Nothing is changed.

    \b
    Example:
        python cli.py verify demo
    """
    from ingest.integrity import verify_log
    from ingest.log import EventLog

    found = verify_log(EventLog(_data_dir(), run_id))
    if as_json:
        _echo_json({"run_id": run_id, "ok": found.ok, "intact_to": found.intact_to, "tail": found.tail,
                    "problem": found.problem, "first_bad": found.first_bad and found.first_bad.name,
                    "first_bad_path": found.first_bad and str(found.first_bad.path),
                    "parts": [_part_row(c) for c in found.parts],
                    "superseded": [c.name for c in found.superseded], "temporary": found.temporary,
                    "foreign": found.foreign, "recorded": found.recorded})  # fmt: skip
    else:
        _render_verification(found)
    if not found.ok:
        sys.exit(1)


def _render_verification(found: Any) -> None:
    rows = [{"status": "DAMAGED" if c.problem else "ok", "seqs": f"{c.first}..{c.last}", **_part_row(c)}
            for c in found.parts]  # fmt: skip
    click.echo(f"run {found.run_id}: {len(found.parts)} parts, seqs 1..{found.tail}")
    click.echo(_table(rows, ["status", "part", "seqs", "level", "problem"]))
    if found.unchecksummed:
        click.echo(f"{found.unchecksummed} part(s) carry no checksum (written before checksums): their pages "
                   "decode and their seqs are whole, a changed value cannot be seen; the writer gives them "
                   "one when it next opens the run")  # fmt: skip
    if not found.recorded:
        click.echo("the run has no record of its parts (written before records): its log is the cover of its "
                   "part files; the writer records them when it next opens the run")  # fmt: skip
    if found.superseded or found.temporary:
        click.echo(f"a crash left {len(found.superseded)} superseded part(s) and {len(found.temporary)} temp "
                   "file(s); the writer removes them when it next opens the run")  # fmt: skip
    for name in found.foreign:
        click.echo(f"FOREIGN  {found.log_dir / name}: not a part the run's record names (nothing reads it; the "
                   f"writer refuses to append until it is moved aside: "
                   f"{command_line(_data_dir(), 'quarantine', found.run_id, name)})")  # fmt: skip
    if found.ok:
        click.echo(f"verify: {len(found.parts)} parts, {found.tail} events: every checksum matches, every page "
                   "decodes, every seq is there once")  # fmt: skip
        return
    click.echo(f"verify: the log is intact up to seq {found.intact_to} of {found.tail}; {found.problem}")
    if found.first_bad is not None:
        click.echo(f"first bad part: {found.first_bad.path} ({found.first_bad.seqs})")
        click.echo(f"nothing is appended to the run until that part and the ones after it are moved aside: "
                   f"{command_line(_data_dir(), 'quarantine', found.run_id, found.first_bad.name)}")  # fmt: skip


@cli.command()
@click.argument("run_id")
@click.argument("part")
@json_option
def quarantine(run_id: str, part: str, as_json: bool) -> None:
    """Move the first damaged part of a run's log, and every part after it, aside (never deleting).

    PART is the part `verify` names (its file name or path), or a FOREIGN file it
    lists (moved alone; the log is unchanged); any other part is refused. The
    parts and the run's spool of finished turns go to <run>/quarantine/. What is
    left is the intact prefix, a state the run really had: replay, paths and sql
    read it, and an exploration continues from it with `explore --resume`, which
    runs again the turns the moved events recorded.

    \b
    Example:
        python cli.py verify demo
        python cli.py quarantine demo part-000000000484-000000001037-L1-0f1245d5fa0aba4904b06b91c43bb35a.parquet
    """
    from ingest.integrity import quarantine as run
    from ingest.log import EventLog

    done = run(EventLog(_data_dir(), run_id), part)
    if done.foreign and not as_json:
        click.echo(f"run {run_id}: moved {done.moved[0].name} to {done.destination} ({done.moved[0].problem}); "
                   f"the log is unchanged, seqs 1..{done.intact_to}")  # fmt: skip
        return
    if as_json:
        _echo_json({"run_id": run_id, "moved": [_part_row(c) for c in done.moved],
                    "destination": str(done.destination), "intact_to": done.intact_to,
                    "events_moved": done.events_moved, "turns_moved": done.turns_moved,
                    "finished_moved": done.finished_moved,
                    "spool_moved": done.spool_moved and str(done.spool_moved),
                    "foreign": done.foreign})  # fmt: skip
        return
    click.echo(f"run {run_id}: moved {len(done.moved)} part(s) to {done.destination}:")
    for c in done.moved:
        click.echo(f"  {c.name} (seqs {c.first}..{c.last})" + (f": {c.problem}" if c.problem else ""))
    if done.spool_moved:
        click.echo(f"  and the spool of finished turns (they followed the old tail): {done.spool_moved}")
    if done.intact_to == 0:
        click.echo("the log holds no event now (its first part was damaged): nothing can be resumed - "
                   "start the run again")  # fmt: skip
        return
    turns = "an unknown number of" if done.turns_moved is None else str(done.turns_moved)
    ended = ", and the run's RunFinished" if done.finished_moved else ""
    click.echo(f"the log now holds seqs 1..{done.intact_to}, intact ({done.events_moved} events moved: "
               f"{turns} finished turns{ended})")  # fmt: skip
    click.echo(f"an exploration continues with: {command_line(_data_dir(), 'explore', '--resume', run_id)} "
               f"(it runs those turns again)")  # fmt: skip


def _open_standard_streams() -> None:
    """Give a closed stdin, stdout or stderr /dev/null before anything else runs.

    Started with fd 2 closed (as some launchers do), Python sets sys.stderr to None
    and a run stopped as its progress display started; and the next file opened - a
    log part - would take a closed number, where a library's or a Teacher process's
    output would land.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:  # Python found the fd closed at start-up
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


def main() -> NoReturn:
    """Run the command line, then end the process without tearing the interpreter down.

    A thread of pyarrow's pool can still be finishing a task when the command
    returns: dropping the task's last reference to a Python buffer needs the GIL,
    and a thread that asks for it while the interpreter finalizes is ended by
    Python 3.11 with ``pthread_exit``, which C++ turns into ``std::terminate``
    ("terminate called without an active exception", exit 134 after ``verify``
    had printed its result: 1 run in 5 to 40 on a loaded machine). So the process
    ends as Python's exit does - threads joined, atexit handlers run, output
    flushed - and then at once, without the teardown such a thread can trip over.
    """
    _open_standard_streams()
    try:
        cli()
        code: int = 0
    except SystemExit as done:
        code = _exit_status(done.code)
    threading._shutdown()  # type: ignore[attr-defined] # noqa: SLF001 - what Python's exit does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (click has said so): quiet
            stream.flush()
    os._exit(code)


def _exit_status(code: object) -> int:
    """The exit status of ``sys.exit(code)``, its message printed as Python would."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
