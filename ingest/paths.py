"""Where runs live (the data directory, run ids, each run's directory) and this user's own files (its config
directory, a private file read), and the file system's rules written once: a file written atomically, a
directory replaced whole, whether a file is still the one seen."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import stat
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


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/teacher-mcts`` (``~/.config/teacher-mcts``): this user's settings and secrets, outside
    every data directory (the derived state's key, serve's kept tokens)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "teacher-mcts"


def read_private(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``: a regular file this user owns and no one else may read or write
    (OSError saying why not; a link is not followed, a FIFO does not block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise OSError(0, "another user owns it or others may read it (chmod 600 it, or remove it)")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def file_signature(path: Path, portable: bool = False) -> tuple[int, ...]:
    """Whether the file (or directory) at ``path`` is still the one seen: what changes whenever its bytes may
    have - its size, modification and change times, inode and device (another file renamed over the name).
    OSError when it cannot be stat'd.

    ``portable``: size and modification time only, for a signature kept in a derived state's key (the same
    for a log copied with its times, ``cp -a``, where inode, device and change time differ).
    """
    st = os.stat(path)
    if portable:
        return st.st_size, st.st_mtime_ns
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


TMP_MARK = ".tmp-"  # begins the name of a write not yet published: the sweeps and the log's writer know them by it


def tmp_path(path: Path) -> Path:
    """Where a write of ``path`` goes until it is whole: the hidden sibling ``.tmp-<pid>-<thread>-<name>`` (the
    process id tells a sweep whether its writer is gone: ``engine.derived.files.sweep_tmp``)."""
    return path.with_name(f"{TMP_MARK}{os.getpid()}-{threading.get_ident()}-{path.name}")


def staging_dir(out: Path) -> Path:
    """Where a directory ``out`` is assembled until it is whole: its hidden sibling ``.<name>.tmp-<pid>``, made
    empty (with ``out``'s parent) for the caller to fill and hand to :func:`replace_dir`."""
    out = Path(out)
    staging = out.parent / f".{out.name}{TMP_MARK}{os.getpid()}"
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def replace_dir(staging: Path, out: Path, recheck: Callable[[], None], then: Callable[[], None] | None = None) -> None:
    """Move the whole directory ``staging`` to ``out``, so ``out`` never holds a part of it.

    An existing ``out`` is first checked again by ``recheck`` (which raises unless it may be replaced: it may
    have changed since the caller first looked), moved aside, and removed once ``staging`` is in place and
    ``then`` (when given) returned. If ``then`` raises, the earlier ``out`` is put back and the new files go
    back to ``staging``, which the caller removes.
    """
    old = None
    if out.exists():
        recheck()
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    try:
        if then is not None:
            then()
    except BaseException:
        os.rename(out, staging)
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old)


def write_atomically(
    path: Path,
    content: bytes | str | Callable[[Path], object],
    what: str | None = None,
    *,
    durable: bool = True,
    mode: int = 0o666,
    keep: bool = False,
    name: Callable[[Path], Path] | None = None,
) -> Path:
    """Write ``content`` (bytes, text, or a function writing the file at the path it is given) to ``path`` whole or
    not at all: to :func:`tmp_path`, then renamed over ``path``; returns the path written.

    ``durable``: the file is fsynced before its rename and the directory after (the new name survives a power
    loss); False only for a cache, rebuilt or found torn by its check when lost. ``mode``: of a file made from
    ``content`` (created anew, never through a link). ``keep``: an existing ``path`` wins (a link, not a
    rename: the first of two writers' files stays). ``name``: the final path, from the file written (its
    digest). OSError when the machine refuses the write (OutputError naming ``path`` and ``what`` when
    ``what`` is given); the temporary file is never left behind.
    """
    path = Path(path)
    tmp = tmp_path(path)
    try:
        if callable(content):
            content(tmp)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with open(fd, "wb") as fh:
                fh.write(content.encode() if isinstance(content, str) else content)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        final = name(tmp) if name is not None else path
        if keep:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, final)
        else:
            os.replace(tmp, final)
        if durable:
            fsync_dir(final.parent)
        return final
    except OSError as err:
        if what is None:
            raise
        raise OutputError(f"{path}: cannot write {what} ({err.strerror or err})") from err
    finally:
        tmp.unlink(missing_ok=True)
