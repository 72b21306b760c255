"""The files of derived state: each one checked when read, written whole or not at all, and where they live.

Every data file of a state is named by its digest, ``<stem>-<digest>.parquet``: the
HMAC-SHA-256, under this user's key (:mod:`engine.derived.trust`), of the state's
identity (``<run>/<flavour>/<source>``), the file's stem and its bytes. A reader hashes
the bytes before using them (the files are the size of the answers: hashing runs at
~1.4 GB/s here) and drops the state when they do not match - a byte changed, a file
truncated, a file copied from another run's state or renamed to another view's, a file
another user or machine wrote (or forged, its digest recomputed without the key). A JSON
document (``state.json``, the source cache) carries the digest of its identity and
content in its ``check`` field. Only regular files are read (a directory, a FIFO, a
link where a file should be is damage, found without opening it: nothing blocks), and
a document only up to a size and a depth. Recorded decisions and exports' facts never
rest on these files (DECISIONS, "Derived state").

A file is written under a temporary name, hashed and renamed to its digest's name
(``ingest.paths.write_atomically``), so a reader killed mid-write leaves only a temporary
file no reader trusts. Not fsynced: a file a power loss tore fails its digest and is
derived again.

:class:`Roots`: ``<data>/derived``, else (where it cannot be written: read-only, full,
no permission) a temporary directory of this process, removed when the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import hmac
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.derived.trust import secret
from ingest.errors import OutputError
from ingest.paths import TMP_MARK, file_signature, write_atomically

_PREFIX = b"teacher-mcts derived state v3\n"
DIGEST_CHARS = 32  # of the hex SHA-256 in a file's name: 128 bits
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
    h = hmac.new(secret(), _PREFIX, hashlib.sha256)
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

    def named(tmp: Path) -> Path:
        crash_point("derived.written")
        return directory / f"{stem}-{file_digest(identity, stem, tmp.read_bytes())}{suffix}"

    return write_atomically(directory / f"{stem}{suffix}", write, durable=False, name=named)


def check_named(path: Path, identity: str) -> None:
    """Damaged when the file's bytes are not those its name's digest records (or it cannot be read);
    FileNotFoundError when it is gone."""
    found = split_name(path.name, path.suffix)
    if found is None:
        raise Damaged(f"{path.name} is not a name this version writes")
    data = read_regular(path)  # (FileNotFoundError: gone, its state replaced meanwhile - not damage)
    if file_digest(identity, found[0], data) != found[1]:
        raise Damaged(f"{path.name} does not hold the bytes its digest records (or another user made it)")


def _check(identity: str, body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(secret(), _PREFIX + f"{identity}\n".encode() + text.encode(), hashlib.sha256).hexdigest()


MAX_DOCUMENT = 64 << 20  # bytes of a checked document read at most (a state's is a few KB; a source cache grows
# with a run's parts: ~100 bytes a part)


def dump_json(identity: str, body: dict[str, Any]) -> str:
    """``body`` as a checked document: its ``check`` field is the keyed digest of its identity and content."""
    return (
        json.dumps(body | {"check": _check(identity, body), "keyed": True}, indent=1, sort_keys=True, default=str)
        + "\n"
    )


def load_json(path: Path, identity: str) -> dict[str, Any] | None:
    """The checked document at ``path`` (None: there is none); Damaged when it is not whole, not its identity's
    or not this user's, not a regular file, too large or nested too deep; Outdated when an earlier version
    wrote it."""
    try:
        data = read_regular(path, MAX_DOCUMENT)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        held = json.loads(data.decode())
        body = {k: v for k, v in held.items() if k not in ("check", "keyed")}
        matches = held.get("check") == _check(identity, body)
    except (ValueError, AttributeError, RecursionError) as err:  # (RecursionError: nested beyond Python's stack)
        raise Damaged(f"{path.name} is not a JSON document") from err
    if "check" not in held or held.get("keyed") is not True:
        raise Outdated(f"{path.name} was written by an earlier version")
    if not matches:
        raise Damaged(f"{path.name} does not match its check (changed, another state's, or not made by this user)")
    return body


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (a link is not followed); Damaged when it is anything else
    (a directory, a FIFO, a socket, a device: found without blocking) or larger than ``limit``;
    FileNotFoundError when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:  # ELOOP: a link; EISDIR...
        raise Damaged(f"{path.name} cannot be read ({err.strerror or err})") from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged(f"{path.name} is not a regular file")
        if limit is not None and st.st_size > limit:
            raise Damaged(f"{path.name} is larger than any this version writes ({st.st_size} bytes)")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    except OSError as err:
        raise Damaged(f"{path.name} cannot be read ({err.strerror or err})") from err
    finally:
        os.close(fd)


ABANDONED_S = 600  # a temporary file of a process gone is removed once this old (another node's may be live)
FORGOTTEN_S = 3600  # any temporary file this old is (no write of a state takes so long)


def sweep_tmp(directory: Path, depth: int = 4) -> None:
    """Remove the temporary files and directories left under ``directory`` by writers that are gone: a killed
    reader's, a write the disk refused (``ingest.paths.tmp_path``: its process gone and the file 10 minutes old,
    or any such file an hour old)."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if is_tmp(entry.name):
                with contextlib.suppress(OSError):
                    age = now - entry.stat(follow_symlinks=False).st_mtime
                    if age > FORGOTTEN_S or (age > ABANDONED_S and not _alive(entry.name)):
                        discard(Path(entry.path))
            elif depth > 1 and entry.is_dir(follow_symlinks=False):
                sweep_tmp(Path(entry.path), depth - 1)


def _alive(name: str) -> bool:
    """Whether the process a temporary name carries (``...tmp-<pid>-...``, also earlier versions' names) runs
    here (True when it has none)."""
    pid = name.split(TMP_MARK, 1)[1].split("-", 1)[0]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's, or no process id at all: not ours to judge
        return True
    return True


def discard(path: Path) -> None:
    """Remove what lies at ``path`` whatever it is (a file, a link, a FIFO, a directory); nothing if nothing."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


class Checked:
    """Files whose digests this process checked, each by the stat it had then: one unchanged since (size,
    times, inode) is not read again."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[int, ...] | None] = {}
        self._lock = threading.Lock()

    def check(self, path: Path, identity: str, missing: str | None = None) -> None:
        """Damaged unless ``path`` holds the bytes its name records (or is missing and ``missing`` says why that
        is damage; else FileNotFoundError: gone, its state replaced meanwhile)."""
        before = stat_key(path)
        if before is None and missing is not None:
            raise Damaged(f"{path.name} is missing ({missing})")
        if before is not None and self._held.get(path) == before:
            return
        check_named(path, identity)
        if stat_key(path) == before:
            with self._lock:
                self._held[path] = before

    def add(self, path: Path) -> None:
        """A file this process wrote and checked as it did."""
        with self._lock:
            self._held[path] = stat_key(path)

    def unchanged(self, path: Path) -> bool:
        """Whether a file checked here is still the file it checked."""
        return path in self._held and stat_key(path) == self._held[path]

    def forget(self, place: Path) -> None:
        """Every file checked under ``place`` (a directory, or one file)."""
        with self._lock:
            for path in [p for p in self._held if p.is_relative_to(place)]:
                del self._held[path]


class Listings:
    """The digest-named files of directories (a state's ``views/``), by stem; a directory is listed again
    only when it changed (its time or inode: a file renamed into it changes its time)."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[tuple[int, ...], dict[str, list[str]]]] = {}

    def files(self, directory: Path) -> dict[str, list[str]]:
        try:
            key = file_signature(directory)
        except OSError:
            return {}
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
    """The file's signature (``ingest.paths.file_signature``), None when it cannot be stat'd."""
    try:
        return file_signature(path)
    except OSError:
        return None


def is_tmp(name: str) -> bool:
    return TMP_MARK in name


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
