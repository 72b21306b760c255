"""How the app's pages are drawn: the Jinja2 templates (autoescaped), their filters, and the headers every
response carries."""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ingest.paths import RUN_ID_RE

HERE = Path(__file__).parent
FOLD_CHARS, FOLD_LINES = 1200, 20  # longer outputs are folded
HEADERS = {
    # Defence in depth: content is escaped, and even a tag that slipped through could run no script.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    # (not no-referrer: a browser then sends "Origin: null" with the SQL form, which SameOrigin refuses)
    "Referrer-Policy": "same-origin",
}


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(value: Any) -> str:
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return _num(value)


def _folded(text: Any) -> bool:
    text = "" if text is None else str(text)
    return len(text) > FOLD_CHARS or text.count("\n") > FOLD_LINES


def _arguments(text: Any) -> str:
    """Tool-call arguments for reading: the JSON indented (the raw text when it is not JSON).

    A flat object (the usual arguments) is laid out item by item with the C encoder: the same
    text as ``indent=2``, which runs Python's slow encoder (most of a long path's page time).
    """
    if not isinstance(text, str):
        return str(text)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and value and not any(isinstance(v, dict | list) for v in value.values()):
        dump = functools.partial(json.dumps, ensure_ascii=False)
        items = (f"  {dump(k)}: {dump(v)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n}"
    return json.dumps(value, indent=2, ensure_ascii=False)


def _call(function: Any) -> dict[str, Any]:
    """A tool call for reading (issue 54): the code it carries shown as code. A ``write``'s ``content``
    (``code``), an ``edit``'s oldString/newString as removed and added lines (``removed``, ``added``), the
    other arguments (``rest``) as ``_arguments`` lays them out; ``kind`` None: arguments shown as before."""
    function = function if isinstance(function, dict) else {}
    raw = function.get("arguments")
    shown: dict[str, Any] = {"name": function.get("name"), "kind": None, "raw": _arguments(raw)}
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return shown
    if not isinstance(value, dict):
        return shown
    if shown["name"] == "write" and isinstance(value.get("content"), str):
        shown |= {"kind": "write", "code": value["content"]}
        rest = {k: v for k, v in value.items() if k != "content"}
    elif (
        shown["name"] == "edit" and isinstance(value.get("oldString"), str) and isinstance(value.get("newString"), str)
    ):
        lines = value["oldString"].splitlines(), value["newString"].splitlines()
        shown |= {"kind": "edit", "removed": lines[0], "added": lines[1]}
        rest = {k: v for k, v in value.items() if k not in ("oldString", "newString")}
    else:
        return shown
    return shown | {"rest": _arguments(json.dumps(rest, ensure_ascii=False)) if rest else ""}


def _content(content: Any) -> str:
    """A message's content as text (a list of parts: their texts)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


TEMPLATES = Environment(
    loader=FileSystemLoader(HERE / "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True
)


def _href(pattern: str, row: dict[str, Any]) -> str:
    """``/run/{run_id}``-style ``pattern`` filled with the row's values, each quoted for a URL."""
    return pattern.format_map({k: quote(str(v), safe="") for k, v in row.items()})


def _fill(pattern: str, row: dict[str, Any]) -> str:
    """``edge-{edge_id}``-style ``pattern`` filled with the row's values as they are (an element's id)."""
    return pattern.format_map(row)


def seconds_text(seconds: Any) -> str:
    """Seconds as a reader says them; "time unknown" when they were not recorded (never "0 s")."""
    from engine.render import duration

    return "time unknown" if seconds is None else duration(seconds)


def time_text(moment: Any) -> str:
    """A recorded time as UTC to the second; "time unknown" when none was recorded."""
    if moment is None:
        return "time unknown"
    if isinstance(moment, datetime) and moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(moment, datetime) else str(moment)


SORT_KEYS = {"started": "started_at", "duration": "run_seconds"}  # a shown column sorted by the value it shows


def arranged(rows: list[dict[str, Any]], columns: list[str], params: Any, prefix: str = "") -> tuple[list, dict]:
    """A table's rows as the page asks (its links, no script needed): those whose shown cells hold the text
    ``params['q']`` (any case), sorted by the column ``params[prefix + 'sort']`` (``prefix + 'order'``: asc or
    desc; an empty cell last); and each column's heading: the link that sorts by it, and whether it does."""
    sort, order = params.get(prefix + "sort"), "desc" if params.get(prefix + "order") == "desc" else "asc"
    text = (params.get("q") or "").strip().lower()
    if text:
        rows = [r for r in rows if any(text in _cell(r.get(c)).lower() for c in columns)]
    if sort in columns:
        key = SORT_KEYS.get(sort, sort)
        known = sorted((r for r in rows if r.get(key) is not None), key=lambda r: r[key], reverse=order == "desc")
        rows = known + [r for r in rows if r.get(key) is None]
    kept = {k: v for k, v in params.items() if k not in (prefix + "sort", prefix + "order")}
    headings = {}
    for c in columns:
        turned = "desc" if c == sort and order == "asc" else "asc"
        state = ("ascending" if order == "asc" else "descending") if c == sort else None
        headings[c] = {"href": "?" + urlencode(kept | {prefix + "sort": c, prefix + "order": turned}), "state": state}
    return rows, headings


def _combine(links: dict[str, str] | None, more: dict[str, str]) -> dict[str, str]:
    """A table's column links with ``more`` added (a count's link to its rows)."""
    return {**(links or {}), **more}


TEMPLATES.filters.update(
    num=_num,
    cell=_cell,
    folded=_folded,
    arguments=_arguments,
    call=_call,
    content=_content,
    href=_href,
    fill=_fill,
    combine=_combine,
    duration=seconds_text,
    when=time_text,
)


def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` drawn with ``context``, with the headers every page carries; ``base``: the prefix of
    every link (``/t/<token>`` under the capability prefix, see engine.web.gate)."""
    context.setdefault("base", request.scope.get("root_path", ""))
    body = TEMPLATES.get_template(name).render(request=request, **context)
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def bad_name(name: str, kind: str) -> str | None:
    """Why ``name`` in a path can name no run or campaign (``kind``), or None when it can."""
    if RUN_ID_RE.match(name) and ".." not in name:
        return None
    return (
        f"no such {kind}: {name!r} is not a {kind}'s name (1 to 128 letters, digits, '_', '-' and '.', "
        "starting with a letter or digit, without '..')"
    )


def problem(request: Request, message: str, status: int = 404) -> HTMLResponse:
    """The page that says what went wrong."""
    return page(request, "problem.html", status, message=message)
