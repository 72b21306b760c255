"""Where runs live: the data directory, run ids and each run's directory."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from ingest.errors import InputError, OutputError

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DATA_ENV = "TEACHER_MCTS_DATA"


def default_data_dir() -> Path:
    """The data directory: ``$TEACHER_MCTS_DATA`` or ``./data``."""
    return Path(os.environ.get(DATA_ENV) or "data")


_program = ["python cli.py"]  # how the user invoked the command line (set_program)


def set_program(argv0: str) -> None:
    """Make hints begin as the user's command did (``sys.argv[0]``): ``teacher-mcts`` when the
    installed script ran and PATH finds that one, else its path; ``python <the path typed>`` for
    ``cli.py`` (relative paths as typed: the hint is pasted where the command was typed)."""
    path = Path(argv0)
    if path.suffix == ".py":
        _program[0] = f"python {shlex.quote(argv0)}"
    elif path.name == "teacher-mcts":
        found = shutil.which("teacher-mcts")
        same = found is not None and Path(found).resolve() == path.resolve()
        _program[0] = "teacher-mcts" if same else shlex.quote(argv0)


def command_line(data_dir: Path | str, *words: str) -> str:
    """The command line a hint prints, so that it works as printed: ``<program> [--data DIR] WORDS``
    (the program as the user invoked it, :func:`set_program`).

    ``--data`` is left out only for the default ``./data`` (a directory relative to the
    current one, like every --data given as a relative path).
    """
    data = [] if Path(data_dir) == Path("data") else ["--data", str(data_dir)]
    return " ".join([_program[0], *(shlex.quote(w) for w in (*data, *words))])


def under(data_dir: Path | str, folder: str = "runs") -> str:
    """Where a message says a run or campaign was looked for: an absolute path (whatever the
    current directory was) and how to look elsewhere."""
    return f"under {Path(data_dir).absolute() / folder} (the data dir is --data DIR, ${DATA_ENV} or ./data)"


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is usable as a directory name, else raise InputError."""
    if not RUN_ID_RE.match(run_id or "") or ".." in run_id:
        msg = f"invalid run id {run_id!r}: use letters, digits, '_', '-' and '.' (max 128)"
        raise InputError(msg)
    return run_id


def run_dir(data_dir: Path, run_id: str) -> Path:
    """The directory of one run."""
    return Path(data_dir) / "runs" / check_run_id(run_id)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What ``<data>`` holds that no output may overwrite: each directory, and what lies in it.
CAMPAIGNS = "campaigns"  # <data>/campaigns/runs/<name>/log: a campaign's log (engine/runset.py)
DERIVED = "derived"  # <data>/derived/<run>: the runs' derived state (engine/derived/keys.DERIVED)
GUARDED = {
    "runs": "the runs of the data directory ({path}: their logs, spools and quarantines)",
    CAMPAIGNS: "the campaigns of the data directory ({path}: their logs)",
    DERIVED: "the derived state of the data directory ({path}: the runs' stored views)",
}


def campaigns_dir(data_dir: Path | str) -> Path:
    """Where campaigns' logs are: ``<data>/campaigns/runs/<name>/log`` (the layout of a run's)."""
    return Path(data_dir) / CAMPAIGNS


def outside_data(path: Path, data_dir: Path, what: str = "the output") -> Path:
    """``path``, refused (OutputError) when it lies in, is or holds a directory of ``data_dir`` that
    holds a log, a record or derived state (``runs``, ``campaigns``, ``derived``).

    Both paths are resolved first (symlinks, ``..``, a ``--data`` that is a link), so a
    link elsewhere that points in is refused too. An output written there could replace
    recorded events. Elsewhere under the data directory (README's ``data/out/...``) is fine.
    """
    target, data = Path(path).resolve(), Path(data_dir).resolve()
    for name, held in GUARDED.items():
        guarded = data / name
        if target.is_relative_to(guarded) or guarded.is_relative_to(target):
            raise OutputError(
                f"{path}: lies among or holds {held.format(path=guarded)} - {what} there could overwrite "
                f"them; write it elsewhere (nothing was written)"
            )
    return Path(path)


def log_command(data_dir: Path | str, command: str, run_id: str, *words: str) -> str:
    """The hint ``command RUN_ID WORDS`` (verify, quarantine) for the log of ``run_id`` under ``data_dir``
    (its ``EventLog.data_dir``), so that it works as printed.

    A campaign's log lies under ``<data>/campaigns``: its hint names the campaign under
    ``<data>``, as ``verify`` and ``quarantine`` take it (unless a run of that name there
    would be taken instead: then the log's own data directory).
    """
    data = Path(data_dir)
    if data.name == CAMPAIGNS and not (run_dir(data.parent, run_id) / "log").exists():
        data = data.parent  # (with a run's directory there, the log's own: right either way)
    return command_line(data, command, run_id, *words)


def write_atomically(path: Path, write: Callable[[Path], object], what: str) -> None:
    """``write(tmp)`` to a hidden sibling of ``path``, then renamed over it: ``path`` is the old file or
    the whole new one, never part of it.

    OutputError names ``path`` and ``what`` when the machine refuses the write;
    the temporary file is never left behind.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise OutputError(f"{path}: cannot write {what} ({err.strerror or err})") from err
    finally:
        tmp.unlink(missing_ok=True)
