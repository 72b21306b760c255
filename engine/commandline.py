"""What every command of cli.py shares: its group and command classes, the option groups
(output, executor, data), the option types and checks, and how a result is shown.

A command's options that several commands take are declared once here, as decorators:
``output()`` adds ``--json`` (and ``--csv``) and hands the command one ``fmt``;
``executor_options()`` adds ``--executor`` and ``--ray-address`` and checks they go together;
every command takes ``--data`` (added by :class:`Command`), read with :func:`data_dir`; a command reads
derived state through :func:`reader`, the one door of its process.
"""

from __future__ import annotations

import errno
import functools
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from engine.process import Terminated, exit_signalled, unwind_on_signals
from ingest.errors import OptionError, ProjectError, os_problem
from ingest.paths import DATA_ENV
from ingest.text import as_utf8

if TYPE_CHECKING:
    from engine.runset import Reader

AGAINST_VERDICT_HELP = "With --rule: drop or keep pairs preferring an attempt failing the prune test to one passing it."
EXPLORE_DIRECTION_HELP = "Score direction (default: the one the roots were selected for; refused when it disagrees)."
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DATA_TYPE = click.Path(file_okay=False, path_type=Path)
DATA_HELP = f"Directory holding runs/ (default: ./data, relative to the current directory; or ${DATA_ENV})."

# Exit codes: a command-line option's value that no run could use (out of range, not a
# number, malformed) is a usage error, exit 2, whether click's types refuse it or the
# library does (OptionError); bad content of files and logs is exit 1 (README).
INT64 = click.IntRange(-(2**63), 2**63 - 1)
COUNT = click.IntRange(min=1, max=2**63 - 1)
MAX_TURN_TIMEOUT_S = 7 * 86_400.0  # a week: any wait longer overflows somewhere (threading's at ~292 years)


def _subcommand_data(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:  # given after the subcommand: it wins over the group's (and $TEACHER_MCTS_DATA)
        ctx.meta["data_dir"] = value


def data_dir() -> Path:
    """--data as given after the subcommand, else before it, else $TEACHER_MCTS_DATA, else ./data."""
    ctx = click.get_current_context()
    return ctx.meta.get("data_dir") or ctx.find_root().obj["data_dir"]


def reader() -> Reader:
    """The command's one :class:`~engine.runset.Reader` of :func:`data_dir` (made on first use): every
    engine call of the command that reads derived state is given it, so the process builds one."""
    from engine.runset import Reader

    meta = click.get_current_context().meta
    if meta.get("reader") is None or meta["reader"].data_dir != data_dir():
        meta["reader"] = Reader(data_dir())
    return meta["reader"]


class Command(click.Command):
    """A command whose text arguments must be UTF-8 (paths are checked where they are used).

    Every command takes ``--data`` too, so that it may follow the subcommand as well as
    precede it (one definition: the option is added here, not by each command).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(
            click.Option(
                ["--data"], type=DATA_TYPE, default=None, expose_value=False, callback=_subcommand_data, help=DATA_HELP
            )
        )

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


class Group(click.Group):
    """Turns ProjectError into a clean ``Error: ...`` message and exit code 1."""

    command_class = Command

    def invoke(self, ctx: click.Context) -> Any:
        received: list[int] = []
        try:
            with unwind_on_signals(received):
                return super().invoke(ctx)
        except Exception as err:
            if received:  # whatever the interruption turned into on its way out
                exit_signalled(received[0])
            if isinstance(err, ProjectError):
                raise click.ClickException(str(err)) from err
            if isinstance(err, UnicodeEncodeError):  # a path no file system can name (a lone surrogate)
                raise click.UsageError(
                    f"{as_utf8(err.object)!r} cannot be a path: it is not text the file system can encode"
                ) from err
            if isinstance(err, ValueError) and "null byte" in str(err):  # os.stat of a path holding NUL (a caller's)
                raise click.UsageError("a path cannot hold a NUL byte (\\x00)") from err
            if isinstance(err, OSError) and err.errno != errno.EPIPE:  # EPIPE: click exits quietly
                raise click.ClickException(os_problem(err)) from err  # a full disk, a quota
            raise
        except (KeyboardInterrupt, Terminated):
            exit_signalled(received[0] if received else signal.SIGINT)


class FiniteFloat(click.FloatRange):
    """A float in a range that is a finite number: click's FloatRange lets nan through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def checked(check: Callable[[Any], Any], prefix: str = "") -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback: ``check(value)`` (None passes), a ProjectError it raises a usage error."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except ProjectError as err:
            raise click.BadParameter(str(err).removeprefix(prefix)) from err

    return callback


def _run_id(value: str) -> str:
    from ingest.log import check_run_id

    return check_run_id(value)


def _parallel(value: int) -> int:
    from engine.config import parallel_problem

    if problem := parallel_problem(value):
        raise OptionError("--parallel", problem)
    return value


def _absolute_dir(value: str) -> str:
    if not value.startswith("/") or len(value) < 2:
        raise OptionError("--workspace", f"must be an absolute directory path, not {value!r}")
    return value


def _strata(value: str) -> tuple[str, ...]:
    from engine.audit import parse_by

    return parse_by(value)


run_id_checked = checked(_run_id)
parallel_checked = checked(_parallel, "--parallel: ")
workspace_checked = checked(_absolute_dir, "--workspace: ")
strata_checked = checked(_strata, "--by: ")


def output_format(as_json: bool, as_csv: bool = False) -> str:
    if as_json and as_csv:
        raise click.UsageError("--json cannot be used with --csv")
    return "json" if as_json else "csv" if as_csv else "text"


def output(csv: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json`` (and ``--csv``, with that help), handed to the command as one ``fmt``: text, json or csv."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_format(*args: Any, as_json: bool, as_csv: bool = False, **kwargs: Any) -> Any:
            return command(*args, fmt=output_format(as_json, as_csv), **kwargs)

        if csv:
            with_format = click.option("--csv", "as_csv", is_flag=True, help=csv)(with_format)
        return click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")(with_format)

    return decorate


def executor_options(ray_address_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--executor local|ray`` and ``--ray-address`` (only with ray), handed on as given."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def checked_executor(*args: Any, executor: str, ray_address: str | None, **kwargs: Any) -> Any:
            if ray_address and executor != "ray":
                raise click.UsageError("--ray-address needs --executor ray")
            return command(*args, executor=executor, ray_address=ray_address, **kwargs)

        checked_executor = click.option("--ray-address", default=None, help=ray_address_help)(checked_executor)
        return click.option(
            "--executor",
            type=click.Choice(["local", "ray"]),
            default="local",
            show_default=True,
            help="Where turns run: this machine, or the workers of a Ray cluster.",
        )(checked_executor)

    return decorate


def token_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``serve``'s ``--token TOKEN`` and ``--new-token`` (one or the other; engine/web/tokens.py)."""

    @functools.wraps(command)
    def checked_token(*args: Any, token: str | None, new_token: bool, **kwargs: Any) -> Any:
        if token is not None and new_token:
            raise click.UsageError(
                "--token and --new-token: give one (--token is not kept, --new-token keeps a new one)"
            )
        return command(*args, token=token, new_token=new_token, **kwargs)

    checked_token = click.option(
        "--new-token",
        is_flag=True,
        help="Replace the token kept for --data with a new one (older links then answer 403).",
    )(checked_token)
    return click.option(
        "--token",
        default=None,
        metavar="TOKEN",
        help="The token every request needs (16-128 letters, digits, '_', '-'), instead of the one kept for --data.",
    )(checked_token)


def show(result: Any, fmt: str = "text") -> None:
    """Print a command's result (an ``engine.render.Output``) as text, JSON or CSV."""
    result.write(fmt, sys.stdout, click.echo)


def name_damaged(damaged: list[Any]) -> None:
    """After an all-runs command's output: name each damaged run it left out (stderr), and exit 1."""
    for run in damaged:
        click.echo(f"Error: {run.message()}", err=True)
    if damaged:
        sys.exit(1)


def show_replayed_collection(run_ids: list[str], fmt: str) -> None:
    """``replay`` of several runs (every run under --data when none is named) in run order, together
    (engine/replay.py): a line per run as it is checked, the differences, a total; exit 1 when any differs."""
    from engine import outputs
    from engine.replay import replay_collection

    run_ids, damaged, replays = replay_collection(data_dir(), run_ids)
    documents, decisions, differ = [], 0, 0
    for result in replays:
        decisions, differ = decisions + result.decisions, differ + len(result.differences)
        shown = outputs.replayed_run(result)
        if fmt == "json":
            documents.append(shown.document)
        else:
            show(shown)  # a line per run as it is checked
    show(outputs.replayed_runs(documents, len(run_ids), decisions, differ), fmt)
    name_damaged(damaged)
    if differ:
        sys.exit(1)
