"""``bundle``: chosen runs' pages as static files that open from disk in a browser, with no server (issue 54).

The pages are the server's own: each is asked of the app (:func:`engine.web.app.create_app`, its
routes, templates and token gate) in this process, as a browser asks the server, starting at the
collection page and following its links among the runs chosen - each run's page, its trees, every
root-to-leaf path of each tree (selected or not) with its conversation, the attempts a tree page
compares, a campaign named - and the CSS and JS. Each link to a page saved is rewritten to the
relative file it was saved as (``file://`` works: no query string, no token, nothing fetched); a
link to a page not saved (search, SQL, a run not chosen, ticked paths compared, a table sorted
otherwise) is kept as its text, marked "not in this bundle", and a form's button (a filter, a
search) is disabled. The collection the pages read holds the chosen runs alone.

The directory is built in a hidden sibling and renamed into place: whole or not at all. It is
never written among a data directory's logs (``ingest.paths.outside_data``), and it replaces only
a new or empty directory or an earlier bundle (its ``bundle.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import html
import json
import posixpath
import re
import secrets
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, urlencode, urlsplit

from engine.collection import Collection, open_runs
from engine.runset import DamagedRun, is_campaign
from engine.web import data
from engine.web.app import create_app
from ingest.errors import OutputError
from ingest.paths import outside_data, replace_dir, staging_dir

MANIFEST = "bundle.json"  # what marks a bundle (one to replace) and says what it holds
KIND = "teacher-mcts bundle"
NOT_BUNDLED = "not in this bundle"
AT_ONCE = 4  # pages asked of the app at once
NOTE = (
    '<p class="help bundle-note">A static bundle (<code>python cli.py bundle</code>): these pages as <code>serve</code>'
    f" drew them when it was written; a faded link leads to a page {NOT_BUNDLED} (search, SQL, other runs).</p>"
)
CSS = (
    "\n/* a static bundle (engine/web/bundle.py): links to pages it does not hold */\n"
    "a[data-not-bundled] { opacity: 0.5; cursor: not-allowed; text-decoration: none; }\n"
)
_ATTR = re.compile(r'\b(href|src|action)="([^"]*)"')
_FORM = re.compile(r"<form\b[^>]*>.*?</form>", re.S)
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Bundled:
    """What ``write_bundle`` wrote: where, the runs and campaigns it holds, its pages and bytes, the runs left out."""

    out: Path
    run_ids: list[str]
    campaigns: list[str]
    pages: int = 0
    size: int = 0
    damaged: list[DamagedRun] = field(default_factory=list)

    def summary(self) -> str:
        runs = f"{len(self.run_ids)} run{'' if len(self.run_ids) == 1 else 's'}"
        size = f"{self.size / 1024:,.0f} KiB"
        return f"wrote {self.out}: {self.pages:,} pages of {runs} ({size}) - open {self.out / 'index.html'}"


def write_bundle(data_dir: Path, names: list[str], out: Path) -> Bundled:
    """The bundle of ``names`` (runs, campaigns; none: every run under ``data_dir``) written to directory ``out``.

    OutputError (nothing written) when ``out`` lies among the data directory's logs, is a file, or is a directory
    holding anything but an earlier bundle; LogError when a name is no run or campaign (open_runs').
    """
    out = Path(out)
    outside_data(out, data_dir, "the bundle")
    _replaceable(out)
    runs = open_runs(data_dir, names or None)
    campaigns = [n for n in dict.fromkeys(names) if is_campaign(data_dir, n)]
    bundled = Bundled(out, list(runs.run_ids), campaigns, damaged=list(runs.damaged))
    with ThreadPoolExecutor(1) as own:  # a loop of its own (a caller's thread may run one: Playwright's, a notebook's)
        pages = own.submit(asyncio.run, _crawl(data_dir, runs, campaigns)).result()
    manifest = {"kind": KIND, "runs": bundled.run_ids, "campaigns": campaigns, "pages": sorted(pages)}
    pages[MANIFEST] = (json.dumps(manifest, indent=2) + "\n").encode()
    bundled.pages, bundled.size = sum(n.endswith(".html") for n in pages), sum(len(b) for b in pages.values())
    _publish(out, lambda tmp: _write(tmp, pages))
    return bundled


# ------------------------------------------------------------------ pages


class _Source(data.Source):
    """The server's source of pages, reading one collection (the chosen runs') as it is now through its reader (the
    process's one derived state), and each run's catalog opened once for its paths' samples (the server opens one a
    sample: most of a path page's time); ``close``."""

    def __init__(self, data_dir: Path, runs: Collection) -> None:
        super().__init__(data_dir)
        self.reader = runs.runs.reader
        self._runs = runs
        self._catalogs: dict[str, Any] = {}
        self._held = contextlib.ExitStack()
        self._sampling = threading.Lock()  # (one sample at a time: a run's samples share its catalog's connection)

    def collection(self) -> Collection:
        return self._runs

    def ready(self, within: float, read: Callable[[Collection], object]) -> bool:
        return True  # (a page is drawn when asked, however long: never the page saying it is being prepared)

    def sample(self, run_id: str, tree_id: str, leaf_id: str, selection: str | None, catalog=None):
        with self._sampling:
            if run_id not in self._catalogs:
                self._catalogs[run_id] = self._held.enter_context(self.reader.open(run_id))
            return super().sample(run_id, tree_id, leaf_id, selection, catalog or self._catalogs[run_id])

    def close(self) -> None:
        self._held.close()


def _key(raw_path: str, query: str) -> str:
    """One page's address as a key: each segment of the path and the query quoted one way."""
    path = "/".join(quote(unquote(s), safe="") for s in raw_path.split("/"))
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + (f"?{urlencode(pairs)}" if pairs else "")


def _bundled(key: str, run_ids: set[str], campaigns: set[str]) -> bool:
    """Whether the page at ``key`` belongs in the bundle: the collection, the static files, a chosen run's page,
    its trees, paths and compares (not its live parts, not ticked paths compared), a campaign named."""
    path = urlsplit(key).path
    parts = [unquote(s) for s in path.split("/")[1:]]
    match parts:
        case [""]:
            return True
        case ["static", name]:
            return re.fullmatch(r"[a-z]+\.(css|js)", name) is not None
        case ["campaign", name]:
            return name in campaigns
        case ["run", run_id] | ["run", run_id, "path"] | ["run", run_id, "tree", _]:
            return run_id in run_ids
        case ["run", run_id, "tree", _, "compare"]:
            return run_id in run_ids
    return False


def _file(key: str) -> str:
    """The file a page is saved as, relative to the bundle: index.html, static/<name>, pages/<slug>-<digest>.html."""
    if key == "/":
        return "index.html"
    if key.startswith("/static/"):
        return key[1:]
    slug = _SLUG.sub("-", unquote_plus(key)).strip("-.")[:100]
    return f"pages/{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.html"


def _rewritten(text: str, here: str, inside: Callable[[str], bool], found: Callable[[str], None]) -> str:
    """A page's HTML (saved as ``here``) with each link to a page in the bundle (``inside``) made the relative link
    to its file (``found`` told of it), each other link to the server marked as not in the bundle."""

    def form(m: re.Match) -> str:  # a form asks the server (a filter, a search, paths compared): its button disabled
        return m[0].replace('<button type="submit"', f'<button type="submit" disabled title="{NOT_BUNDLED}"')

    def attr(m: re.Match) -> str:
        name, value = m[1], m[2]
        parts = urlsplit(html.unescape(value))
        if value.startswith("?"):  # this page asked otherwise (sorted by another column): the server's to draw
            return f'data-not-bundled="{value}"' + (f' title="{NOT_BUNDLED}"' if name == "href" else "")
        if not value.startswith("/") or parts.scheme or parts.netloc:
            return m[0]  # an anchor in the page, data:, another site: as it is
        key = _key(parts.path, parts.query)
        if not inside(key):
            return f'data-not-bundled="{value}"' + (f' title="{NOT_BUNDLED}"' if name == "href" else "")
        found(key)
        link = posixpath.relpath(_file(key), posixpath.dirname(here) or ".")
        return f'{name}="{link}{"#" + html.escape(parts.fragment) if parts.fragment else ""}"'

    text = _FORM.sub(form, text)
    return _ATTR.sub(attr, text).replace("<main>", "<main>\n" + NOTE, 1)


async def _crawl(data_dir: Path, runs: Collection, campaigns: list[str]) -> dict[str, bytes]:
    """Every page of the bundle by its file: from the collection page, each page it links to that belongs."""
    token = secrets.token_urlsafe(24)
    app = create_app(data_dir, token)
    app.state.source = source = _Source(data_dir, runs)
    run_ids, named = set(runs.run_ids), set(campaigns)
    files: dict[str, bytes] = {}
    queue, seen = ["/"], {"/"}

    def found(key: str) -> None:
        if key not in seen:
            seen.add(key)
            queue.append(key)

    try:
        while queue:  # a few pages at once, as the server draws pages at once (each query on a cursor of its own)
            asked = queue[:AT_ONCE]
            del queue[:AT_ONCE]
            answers = await asyncio.gather(*(_get(app, token, k) for k in asked))
            for key, (status, kind, body) in zip(asked, answers, strict=True):
                if status >= 500:
                    raise OutputError(f"the page {key} failed to draw ({status}): nothing was written")
                name = _file(key)
                if kind.startswith("text/html"):
                    page = _rewritten(body.decode(), name, lambda k: _bundled(k, run_ids, named), found)
                    body = page.encode()
                elif name == "static/app.css":
                    body += CSS.encode()
                files[name] = body
    finally:
        source.close()
    return files


async def _get(app, token: str, key: str) -> tuple[int, str, bytes]:
    """GET ``key`` of the app in this process: its status, content type and body (a request as a browser sends it,
    the token in its header)."""
    path, _, query = key.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"token {token}".encode()), (b"accept", b"text/html")],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    answer: dict = {"body": []}
    asked = asyncio.Event()

    async def receive() -> dict:  # the request, then nothing until the answer is sent (no disconnect)
        if asked.is_set():
            await asyncio.Event().wait()
        asked.set()
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["type"] = dict(message.get("headers", [])).get(b"content-type", b"").decode()
        elif message["type"] == "http.response.body":
            answer["body"].append(message.get("body", b""))

    await app(scope, receive, send)
    return answer["status"], answer["type"], b"".join(answer["body"])


# ------------------------------------------------------------------ the directory


def _previous(out: Path) -> bool:
    """Whether ``out`` holds an earlier bundle (its manifest says so)."""
    try:
        return json.loads((out / MANIFEST).read_text()).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def _replaceable(out: Path) -> None:
    """OutputError unless ``out`` is new, an empty directory or an earlier bundle."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise OutputError(f"{out}: not a directory - give a directory to write the bundle to (nothing was written)")
    if any(out.iterdir()) and not _previous(out):
        raise OutputError(
            f"{out}: not empty and not an earlier bundle - give a new or empty directory (nothing was written)"
        )


def _write(tmp: Path, files: dict[str, bytes]) -> None:
    for name, body in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(body)


def _publish(out: Path, write: Callable[[Path], None]) -> None:
    """``write`` the directory in a hidden sibling of ``out``, then put it in place (an earlier bundle or empty
    directory there is replaced): ``out`` holds the whole bundle or what it held before."""
    try:
        staging = staging_dir(out)
        try:
            write(staging)
            replace_dir(staging, out, lambda: _replaceable(out))  # (checked again: as late as it can be)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as err:
        raise OutputError(
            f"{out}: the bundle could not be written ({err.strerror or err}); nothing was written"
        ) from None
