"""What makes stored derived state this user's: a secret kept outside every data directory.

Every stored file's digest (its name's, or a document's ``check``) is an HMAC keyed by
this secret, so a file that another user, another machine or a hand wrote - its digest
recomputed or not - does not verify, and is dropped and derived again like damage: a
data directory copied from a colleague, or on a file system others write, is rebuilt,
never trusted. The secret is 32 random bytes in ``$TEACHER_MCTS_KEY`` (a file's path),
else ``$XDG_CONFIG_HOME/teacher-mcts/derived.key`` (``~/.config/...``), made on first use
owner-only; a key file another user owns or others may read is not used. Where no key
file can be kept, the process uses a key of its own (its states serve that process only)
and says so once. The views' empty catalog, which holds their SQL (code), is cached in this
user's cache directory (:func:`cache_dir`, ``$XDG_CACHE_HOME/teacher-mcts``), never in a data directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

from ingest.paths import config_dir, read_private, write_atomically

KEY_ENV = "TEACHER_MCTS_KEY"
KEY_BYTES = 32
_lock = threading.Lock()
_held: dict[str, bytes] = {}


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/teacher-mcts`` (``~/.cache/teacher-mcts``): this user's, outside any data directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "teacher-mcts"


def key_path() -> Path:
    return Path(os.environ.get(KEY_ENV) or config_dir() / "derived.key")


def secret() -> bytes:
    """This user's key (read once a process and path; made on first use)."""
    path = key_path()
    with _lock:
        if str(path) not in _held:
            _held[str(path)] = _load(path)
        return _held[str(path)]


def _load(path: Path) -> bytes:
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        return _own(f"{path} cannot be used ({err.strerror or err})")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, os.urandom(KEY_BYTES), mode=0o600, keep=True)  # another process's made first wins
        return _read(path)
    except OSError as err:
        return _own(f"{path} cannot be made ({err.strerror or err})")


def _read(path: Path) -> bytes:
    """The key in ``path``: a private file (:func:`read_private`) of KEY_BYTES."""
    data = read_private(path, KEY_BYTES + 1)
    if len(data) != KEY_BYTES:
        raise OSError(0, f"it does not hold {KEY_BYTES} bytes")
    return data


def _own(why: str) -> bytes:
    with contextlib.suppress(OSError):
        print(
            f"note: the key that marks derived state as this user's: {why} - this process uses a key of its own, "
            f"so no state is kept for other processes (set ${KEY_ENV} to a file it can keep)",
            file=sys.stderr,
        )
    return os.urandom(KEY_BYTES)
