"""The files of derived state: each one checked when read, written whole or not at all, and where they live.

Every data file of a state is named by its digest, ``<stem>-<digest>.parquet``: the
SHA-256 of the state's identity (``<run>/<flavour>/<source>``), the file's stem and its
bytes. A reader hashes the bytes before using them (the files are the size of the
answers: hashing runs at ~1.4 GB/s here) and drops the state when they do not match -
a byte changed, a file truncated, a file copied from another run's state or renamed
to another view's. A JSON document (``state.json``, the source cache) carries the
digest of its identity and content in its ``check`` field. A digest stops damage, not
someone who rewrites the digests too: recorded decisions and exports' facts never
rest on these files alone (DECISIONS, "Derived state").

A file is written under a temporary name, hashed, fsynced and renamed to its digest's
name, so a reader killed mid-write leaves only a temporary file no reader trusts.

:class:`Roots`: ``<data>/derived``, else (where it cannot be written: read-only, full,
no permission) a temporary directory of this process, removed when the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingest.errors import OutputError

_PREFIX = b"teacher-mcts derived state v2\n"
DIGEST_CHARS = 32  # of the hex SHA-256 in a file's name: 128 bits
_TMP_MARK = ".tmp-"
# The errors that say a directory cannot hold the state: move to the next root.
UNWRITABLE = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}
)
FALLBACK_PREFIX = "teacher-mcts-derived-"
SHM = Path("/dev/shm")  # memory, where the temporary directory is full too


class Damaged(Exception):
    """A stored file that does not hold what its digest says (args: why)."""


class Outdated(Damaged):
    """A stored document written by an earlier version (no check): not damage, but not to be read."""


def file_digest(identity: str, stem: str, data: bytes) -> str:
    h = hashlib.sha256(_PREFIX)
    h.update(f"{identity}\n{stem}\n".encode())
    h.update(data)
    return h.hexdigest()[:DIGEST_CHARS]


def split_name(name: str, suffix: str = ".parquet") -> tuple[str, str] | None:
    """``(stem, digest)`` of a digest-named file, or None for any other name."""
    if not name.endswith(suffix) or name.startswith("."):
        return None
    stem, sep, digest = name[: -len(suffix)].rpartition("-")
    if not sep or len(digest) != DIGEST_CHARS:
        return None
    return stem, digest


def write_named(directory: Path, stem: str, identity: str, write: Callable[[Path], object], suffix=".parquet") -> Path:
    """``write(tmp)`` a file in ``directory``, then rename it to ``<stem>-<digest><suffix>``; its path.

    OSError when the machine refuses the write (the temporary file is removed).
    """
    from ingest.faults import crash_point

    tmp = directory / f".{stem}{_TMP_MARK}{os.getpid()}-{threading.get_ident()}{suffix}"
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            data = fh.read()
            os.fsync(fh.fileno())
        crash_point("derived.written")
        path = directory / f"{stem}-{file_digest(identity, stem, data)}{suffix}"
        os.replace(tmp, path)
        return path
    finally:
        tmp.unlink(missing_ok=True)


def check_named(path: Path, identity: str) -> None:
    """Damaged when the file's bytes are not those its name's digest records (or it cannot be read);
    FileNotFoundError when it is gone."""
    found = split_name(path.name, path.suffix)
    if found is None:
        raise Damaged(f"{path.name} is not a name this version writes")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise  # gone (its state replaced meanwhile): not damage
    except OSError as err:
        raise Damaged(f"{path.name} cannot be read ({err.strerror or err})") from err
    if file_digest(identity, found[0], data) != found[1]:
        raise Damaged(f"{path.name} does not hold the bytes its digest records")


def _check(identity: str, body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(_PREFIX + f"{identity}\n".encode() + text.encode()).hexdigest()


def dump_json(identity: str, body: dict[str, Any]) -> str:
    """``body`` as a checked document: its ``check`` field is the digest of its identity and content."""
    return json.dumps(body | {"check": _check(identity, body)}, indent=1, sort_keys=True, default=str) + "\n"


def load_json(path: Path, identity: str) -> dict[str, Any] | None:
    """The checked document at ``path`` (None: there is none); Damaged when it is not whole or not its identity's."""
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise Damaged(f"{path.name} cannot be read ({err})") from err
    try:
        held = json.loads(text)
        body = {k: v for k, v in held.items() if k != "check"}
        matches = held.get("check") == _check(identity, body)
    except (ValueError, AttributeError) as err:
        raise Damaged(f"{path.name} is not a JSON document") from err
    if "check" not in held:
        raise Outdated(f"{path.name} was written by an earlier version")
    if not matches:
        raise Damaged(f"{path.name} does not match its check (changed, or another state's)")
    return body


class Listings:
    """The digest-named files of directories (a state's ``views/``), by stem; a directory is listed again
    only when it changed (its time or inode: a file renamed into it changes its time)."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[tuple[int, int], dict[str, list[str]]]] = {}

    def files(self, directory: Path) -> dict[str, list[str]]:
        try:
            st = os.stat(directory)
        except OSError:
            return {}
        key = (st.st_mtime_ns, st.st_ino)
        held = self._held.get(directory)
        if held is not None and held[0] == key:
            return held[1]
        found: dict[str, list[str]] = {}
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(directory)):
                parsed = split_name(name)
                if parsed is not None:
                    found.setdefault(parsed[0], []).append(name)
        self._held[directory] = (key, found)
        return found


def stat_key(path: Path) -> tuple[int, ...] | None:
    """What changes whenever a file's bytes may have: size, times (ctime too: no process sets it), inode."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def is_tmp(name: str) -> bool:
    return _TMP_MARK in name


class Roots:
    """Where states are read from and written to: ``<data>/derived``, then fallbacks made by this process.

    Every root made is read (a read-only data directory's stored states still serve);
    states are written to the newest root that took a write. A root that refuses a
    write (UNWRITABLE errors) is passed over for a temporary directory of this
    process (``$TMPDIR``, else ``/dev/shm``: memory), removed when it ends; a note on
    stderr says so once. Their names are chosen when the process starts (``candidates``,
    random: no other process can guess one), so a query connection may be allowed to
    read them before they exist. Temporary directories of processes that are gone
    (killed before their cleanup) are removed when the next one is made.
    """

    def __init__(self, primary: Path) -> None:
        self.primary = primary
        name = f"{FALLBACK_PREFIX}{os.getpid()}-{os.urandom(8).hex()}"
        self.candidates: list[Path] = [primary] + [base / name for base in (Path(tempfile.gettempdir()), SHM)]
        self.all: list[Path] = [primary]
        self._write = 0
        self._lock = threading.Lock()

    @property
    def writable(self) -> Path:
        return self.all[self._write]

    def refused(self, root: Path, err: BaseException) -> Path:
        """``root`` refused a write (``err``: an OSError, or DuckDB's writing a file): the next root to write
        to (made now if needed). OutputError when no temporary directory can take it either."""
        why = getattr(err, "strerror", None) or str(err).strip().splitlines()[0]
        with self._lock:
            if self.all[self._write] != root:  # another thread moved on already
                return self.writable
            for made in self.candidates[self.candidates.index(self.writable) + 1 :]:
                with contextlib.suppress(OSError):
                    _sweep(made.parent)
                    made.mkdir(mode=0o700)  # (never an existing one, nor through a link)
                    atexit.register(shutil.rmtree, made, True)
                    self.all.append(made)
                    self._write = len(self.all) - 1
                    print(
                        f"note: cannot keep derived state in {root} ({why}): it is kept in "
                        f"{made} for this process only (removed when it ends), and every process derives it again",
                        file=sys.stderr,
                    )
                    return made
            raise OutputError(f"{root}: cannot keep derived state ({why}), and no temporary directory can either")


def unwritable(err: BaseException) -> bool:
    """Whether ``err`` says a directory cannot take the state (rather than something else going wrong)."""
    if isinstance(err, OSError):
        return err.errno in UNWRITABLE
    text = str(err)  # DuckDB writing a file: its IOException carries the system's message
    return any(os.strerror(e) in text for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES))


def _sweep(base: Path) -> None:
    """Remove the temporary roots of processes that are gone (a kill -9 skips the removal at exit)."""
    for path in base.glob(f"{FALLBACK_PREFIX}*"):
        pid = path.name[len(FALLBACK_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, OverflowError):  # another user's process, or not a process id at all: not ours to judge
            pass
