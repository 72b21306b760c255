"""What lets a request in: the server's token (:class:`TokenGate`), and for a query, this server's own page
(:class:`SameOrigin`).

The token travels in the path, never in a cookie. Cookies do not tell ports apart: a cookie
of ``127.0.0.1:8000`` goes to every service on ``127.0.0.1`` the browser visits, whatever
its port, and SameSite does not stop it (ports are one site). So every page is served under
a capability prefix, ``/t/<token>/``: its links keep the prefix, the address bar shows it, a
deep link copied from it works wherever it is opened, and the browser keeps nothing another
port's page can receive. Scripts send ``Authorization: token <t>`` on the bare paths. The
address of before, ``?token=<t>``, is redirected to the same page under the prefix.

A browser that asks for a bare path without the token (a link typed, or from the docs) gets
a page saying what to open; its one script forwards the browser to the same page under the
prefix when this origin's ``localStorage`` holds the token (app.js keeps it there on every
page served under the prefix). ``localStorage`` is the origin's own, port included: no other
port's page can read it, and it is never sent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX = "/t/"  # the capability prefix: /t/<token>/...
STORED = "teacher-mcts-token"  # the localStorage key app.js keeps the token under (its origin's: its port's)
REFUSED = "403: this server needs its token - open the address it printed when it started (http://HOST:PORT/t/...)"

# The page's one script: forward a bare address to the prefixed one if this origin keeps a token; a token that
# no longer opens this server (it was restarted) is forgotten, so the page never forwards in a loop.
FORWARD = (
    '"use strict";'
    f'(() => {{const key = "{STORED}", kept = localStorage.getItem(key), path = location.pathname;'
    f'if (path.startsWith("{PREFIX}")) {{'
    f'if (kept && path.startsWith("{PREFIX}" + kept + "/")) localStorage.removeItem(key);'
    "return;}"
    "if (kept && /^[A-Za-z0-9_-]+$/.test(kept)) {"
    'document.getElementById("gate").textContent = "Opening this page with the token kept by this browser...";'
    f'location.replace("{PREFIX}" + kept + path + location.search + location.hash);}}}})();'
)
_HASH = base64.b64encode(hashlib.sha256(FORWARD.encode()).digest()).decode()
GATE_HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src 'sha256-{_HASH}'; img-src data:; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
GATE_PAGE = (
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
    "<title>teacher-mcts: this server needs its token"
    f'</title></head>\n<body><p id="gate">{REFUSED}</p>\n<script>{FORWARD}</script></body></html>\n'
)


class TokenGate:
    """Let through requests carrying the token: under ``/t/<token>/`` (the app then sees the rest of the path,
    ``root_path`` holding the prefix its pages' links keep), or with ``Authorization: token <t>``; ``?token=``
    is redirected under the prefix. Anything else: 403, the gate page for a browser (see the module)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", token):
            raise ValueError("a token is letters, digits, '_' and '-' (it is a segment of every address)")
        self.app = app
        self.token = token

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        root, path = scope.get("root_path", ""), scope["path"]
        within = path.removeprefix(root)
        if within.startswith(PREFIX):
            given, slash, rest = within[len(PREFIX) :].partition("/")
            if self._matches(given):
                if not slash:  # /t/<token>: its pages' links are relative to /t/<token>/
                    await RedirectResponse(f"{root}{PREFIX}{self.token}/", 308)(scope, receive, send)
                    return
                await self.app({**scope, "root_path": f"{root}{PREFIX}{self.token}"}, receive, send)
                return
        elif self._matches(request.query_params.get("token")):
            url = request.url.remove_query_params("token")
            where = f"{root}{PREFIX}{self.token}{within}" + (f"?{url.query}" if url.query else "")
            await RedirectResponse(where, 303)(scope, receive, send)
            return
        elif self._matches(request.headers.get("authorization", "").removeprefix("token ")):
            await self.app(scope, receive, send)
            return
        await _refused(request)(scope, receive, send)


def _refused(request: Request) -> Response:
    """403: the gate page for a browser's page (it may forward), the sentence alone for anything else."""
    if "text/html" in request.headers.get("accept", "") and request.method in ("GET", "HEAD"):
        return HTMLResponse(GATE_PAGE, 403, headers=GATE_HEADERS)
    return PlainTextResponse(REFUSED + "\n", 403)


class SameOrigin:
    """Refuse a request other than GET or HEAD (the SQL page's query) that another site's page sent.

    Its ``Origin``, when sent, must be this server's own; its ``Sec-Fetch-Site``, when
    sent, ``same-origin`` (this server's page) or ``none`` (typed by the user).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            request = Request(scope)
            own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
            origin, site = request.headers.get("origin"), request.headers.get("sec-fetch-site")
            problem = None
            if origin is not None and origin.lower() != own:
                problem = f"it was sent by a page of {origin}, not of this server ({own})"
            elif site is not None and site not in ("same-origin", "none"):
                problem = f"it was sent by a page of another site (Sec-Fetch-Site: {site})"
            if problem:
                message = f"403: refused - {problem}; run queries from this server's SQL page\n"
                await PlainTextResponse(message, 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
