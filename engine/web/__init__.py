"""``serve``: a local web app over a collection's views, live while runs are written; ``bundle``: its pages on disk.

Pages: the collection (runs with their start and duration, campaigns, tasks, the audit;
tables sorted and filtered by their links), a campaign, a run (its trees as the report
draws them, followed as parts land), a tree (its nodes, their attempts and verdicts), a
path (any root-to-leaf path, selected or not: its whole conversation as ``export`` writes
it), compares (a node's attempts side by side with their code; any paths of a tree),
search (every transcript, failures alone, and the rows a page's count stands for:
:mod:`engine.web.lists`), and SQL (the read-only sandbox of ``sql``, its ids linked to
their pages). Failed tool calls and evals are marked wherever they show. Every request
needs a token (:mod:`engine.web.gate`), kept per data directory so links last across
restarts (:mod:`engine.web.tokens`). Every page reads through the server's one reader
(:mod:`engine.web.data`). :mod:`engine.web.bundle` saves chosen runs' pages, drawn by
the same app, as files that open with no server.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from engine.web.app import create_app
from engine.web.gate import PREFIX
from engine.web.tokens import given_token, kept_token
from ingest.errors import InputError

__all__ = ["create_app", "serve"]


def serve(
    data_dir: Path, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, new_token: bool = False
) -> None:
    """Serve the app on ``host:port`` until interrupted; every request needs a token, printed with the address:
    ``token``, else the one kept for ``data_dir`` (``new_token``: a new one kept; :mod:`engine.web.tokens`).

    InputError when ``data_dir`` is not a directory.
    """
    import uvicorn

    if not Path(data_dir).is_dir():
        raise InputError(f"{data_dir}: no such directory - give --data the directory that holds (or will hold) runs/")
    listening = _listen(host, port)  # before the address is printed: a port in use is an error, not a log line
    if token is not None:
        token, kept = given_token(token), "given with --token"
    else:
        token, kept = kept_token(Path(data_dir), new_token)
    app = create_app(Path(data_dir), token, host)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {data_dir} at http://{shown}:{port}{PREFIX}{token}/", file=sys.stderr, flush=True)
    print(
        "  (every request needs that token: the pages live under that address - keep it, every link of a page"
        " does - and scripts send 'Authorization: token <it>')",
        file=sys.stderr,
        flush=True,
    )
    print(f"  (the token: {kept})", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[listening])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; InputError naming the address when it cannot be."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise InputError(f"cannot serve on {host}:{port}: {err.strerror or err} - check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise InputError(f"cannot serve on {host}:{port}: {err.strerror or err} - choose another with --port") from None
    return sock
