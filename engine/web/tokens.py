"""The token ``serve`` asks of every request, kept per data directory so its links last across restarts.

A saved link (``/t/<token>/run/...``) keeps working after ``serve`` is started again on the
same data directory: the token is kept in a file of this user's, outside every data
directory (a data directory is input: nothing of the server's is written into it), named by
a digest of the directory's resolved path: ``$XDG_CONFIG_HOME/teacher-mcts/serve-tokens/<digest>``
(``~/.config/...``). The file is made owner-only (0600, in a 0700 directory) and is used only
while it is: a file another user owns, that others may read or write, or that is not a
regular file holding a token is not trusted - it is replaced by a new token (the old one may
have been read), and the server says so. ``--token`` gives the token instead (scripts),
``--new-token`` replaces the kept one (every link of before then answers 403). Where no
file can be kept, the server uses a token of its own for this start, and says so.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from ingest.errors import InputError
from ingest.paths import config_dir, read_private, write_atomically

TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def token_path(data_dir: Path) -> Path:
    """Where the token of ``data_dir`` is kept (by its resolved path's digest)."""
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:32]
    return config_dir() / "serve-tokens" / digest


def given_token(token: str) -> str:
    """``--token``'s value, checked: 16 to 128 letters, digits, '_' and '-' (a segment of every address)."""
    if not TOKEN_RE.fullmatch(token):
        raise InputError("--token: give 16 to 128 letters, digits, '_' and '-' (it is a segment of every address)")
    return token


def kept_token(data_dir: Path, new: bool = False) -> tuple[str, str]:
    """The token of ``data_dir`` and a sentence saying where it is kept (or why it is not): the kept one, else
    a new one kept (``new``: a new one in any case)."""
    path = token_path(data_dir)
    why = "a new token was made"
    if not new:
        try:
            return _read(path), f"kept in {path}: it lasts across restarts (--new-token replaces it)"
        except FileNotFoundError:
            pass
        except OSError as err:
            why = f"{path} was not used ({err.strerror or err}): a new token replaces it"
    token = secrets.token_urlsafe(24)
    try:
        _write(path, token)
    except OSError as err:
        return token, f"{path} cannot be kept ({err.strerror or err}): this token lasts until the server stops"
    return token, f"{why}, kept in {path}: it lasts across restarts"


def _read(path: Path) -> str:
    """The token in ``path``: a private file (``ingest.paths.read_private``)."""
    text = read_private(path, 256).decode("ascii", "replace").strip()
    if not TOKEN_RE.fullmatch(text):
        raise OSError(0, "it holds no token")
    return text


def _write(path: Path, token: str) -> None:
    """``token`` into ``path``, owner-only, whole (a new file moved over the old one)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, token + "\n", mode=0o600)
