"""``serve``: a local web app over a collection's views, live while runs are written.

Pages: the collection (runs, tasks, the audit), a run (its trees as the report draws
them, followed as parts land), a tree (its nodes and their turns), a path (its whole
conversation as ``export`` writes it), and SQL (the read-only sandbox of ``sql``).
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from engine.web.app import create_app
from ingest.errors import InputError

__all__ = ["create_app", "serve"]


def serve(data_dir: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the app on ``host:port`` until interrupted; every request needs a token, printed with the address.

    InputError when ``data_dir`` is not a directory.
    """
    import uvicorn

    if not Path(data_dir).is_dir():
        raise InputError(f"{data_dir}: no such directory - give --data the directory that holds (or will hold) runs/")
    token = secrets.token_urlsafe(24)
    app = create_app(Path(data_dir), token, host)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {data_dir} at http://{shown}:{port}/?token={token}", file=sys.stderr, flush=True)
    print(
        "  (every request needs that token: open the address above once, it sets a cookie)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
