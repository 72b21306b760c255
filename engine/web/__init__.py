"""``serve``: a local web app over a collection's views, live while runs are written.

Pages: the collection (runs, tasks, the audit), a run (its trees as the report draws
them, followed as parts land), a tree (its nodes and their turns), a path (its whole
conversation as ``export`` writes it), and SQL (the read-only sandbox of ``sql``).
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from engine.web.app import LOOPBACK, create_app
from ingest.errors import InputError

__all__ = ["create_app", "serve"]


def serve(data_dir: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the app on ``host:port`` until interrupted; a non-loopback host gets a token, printed with the address.

    InputError when ``data_dir`` is not a directory.
    """
    import uvicorn

    if not Path(data_dir).is_dir():
        raise InputError(f"{data_dir}: no such directory - give --data the directory that holds (or will hold) runs/")
    token = None if host in LOOPBACK else secrets.token_urlsafe(24)
    app = create_app(Path(data_dir), host, token)
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    print(f"serving {data_dir} at {address}", file=sys.stderr, flush=True)
    if token:
        print(
            "  (every request needs that token: open the address above once, it sets a cookie)",
            file=sys.stderr,
            flush=True,
        )
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
