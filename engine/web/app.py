"""The web app's routes: Starlette endpoints rendering Jinja2 templates (autoescaped).

No endpoint changes a run: every one reads views through :class:`~engine.web.data.Source`
(whose collection keeps the runs' derived state, as every reader does) or the log
through the export's sample building. Every page answers GET, but the SQL page's query,
which is POSTed. Every request needs the server's token (:class:`TokenGate`), on the
loopback too; a POST must come from this server's own pages (:class:`SameOrigin`); a
loopback bind refuses requests naming another host (a page of another site cannot
reach it by DNS rebinding).

Pages read at once (no lock is held while a query runs); the SQL page is
:mod:`engine.web.sql`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from engine.report import CSS as TREE_CSS
from engine.report import LEGEND, drawn_trees
from engine.web import data, sql
from engine.web.gate import SameOrigin, TokenGate
from engine.web.live import run_events
from engine.web.pages import HEADERS, HERE, TEMPLATES, arranged, bad_name, page, problem, seconds_text, time_text
from engine.web.search import search_page
from ingest.errors import ProjectError
from ingest.listing import run_ids

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PREPARE_WAIT = 1.0  # seconds the collection page waits for the collection's first opening before saying it is opening
RUN_COLUMNS = ["run_id", "task", "backend", "started", "duration", "trees", "trees_done", "finished", "roots"]
RUN_COLUMNS += ["selected_paths", "n_eff", "n_eff_ratio", "tokens", "cost"]
CAMPAIGN_COLUMNS = ["campaign", "policy", "tasks", "budget_edges", "spent_edges", "budget_tokens", "spent_tokens"]
CAMPAIGN_COLUMNS += ["rounds", "stop_reason", "finished"]


class NoSuchName(Exception):
    """A path names no run or campaign (not a name one can have): the page says so, 404."""


def _run_id(request: Request) -> str:
    """The run the path names; NoSuchName when it is no run's name (``a..b``)."""
    run_id = request.path_params["run_id"]
    if (why := bad_name(run_id, "run")) is not None:
        raise NoSuchName(why)
    return run_id


# ------------------------------------------------------------------- pages


def collection(request: Request) -> HTMLResponse:
    source: data.Source = request.app.state.source
    if not source.ready(request.app.state.prepare_wait, data.collection_page):  # a first reading: say so
        return page(request, "preparing.html", runs=len(run_ids(source.data_dir)), data_dir=source.data_dir, again=2)
    tables, message, runs, left_out = None, None, None, []
    try:
        runs = source.collection()
        tables = data.collection_page(runs)
        left_out = source.damaged(runs)
    except ProjectError as err:
        message = str(err)
    campaigns, damaged = data.campaigns_table(source.data_dir, runs)
    damaged = left_out + damaged
    shown: dict[str, Any] = {"runs_all": 0, "campaigns_all": len(campaigns)}
    params = request.query_params
    if tables is not None:  # each run's start and duration shown as read; sorted and filtered as the page asks
        for r in tables["runs"]:
            r["started"], r["duration"] = time_text(r["started_at"]), seconds_text(r["run_seconds"])
        shown["runs_all"] = len(tables["runs"])
        tables["runs"], shown["run_headings"] = arranged(tables["runs"], RUN_COLUMNS, params)
    campaigns, shown["campaign_headings"] = arranged(campaigns, CAMPAIGN_COLUMNS, params, "campaign_")
    return page(
        request,
        "collection.html",
        tables=tables,
        campaigns=campaigns,
        damaged=damaged,
        message=message,
        data_dir=source.data_dir,
        run_columns=RUN_COLUMNS,
        campaign_columns=CAMPAIGN_COLUMNS,
        q=(params.get("q") or "").strip(),
        **shown,
    )


def campaign(request: Request) -> HTMLResponse:
    from engine.runset import is_campaign

    name = request.path_params["name"]
    data_dir = request.app.state.source.data_dir
    if (why := bad_name(name, "campaign")) is not None:
        raise NoSuchName(why)
    if not is_campaign(data_dir, name):
        return problem(request, f"no such campaign: {name!r} under {data_dir}")
    try:
        shown = data.campaign_page(data_dir, name, request.app.state.source.collection())
    except ProjectError as err:  # a damaged campaign: a page that says what is damaged
        message = data.damaged_campaign(data_dir, name, err)
        return page(
            request, "problem.html", title=f"campaign {name}", heading=f"Campaign {name} is damaged", message=message
        )
    return page(request, "campaign.html", campaign=name, **shown)


def run(request: Request) -> HTMLResponse:
    """A run's page; 404 "unknown run" when no run of that name is on disk or being written (a typo), the page
    still following it should one start under that name (as the waiting page of a run being started does)."""
    from ingest.listing import being_written
    from ingest.log import EventLog

    run_id = _run_id(request)
    log = EventLog(request.app.state.source.data_dir, run_id)
    known = log.exists() or being_written(log.dir)
    live = _live(request, run_id, unknown=not known)
    return page(request, "run.html", 200 if known else 404, run_id=run_id, live=live, unknown=not known)


def run_live(request: Request) -> HTMLResponse:
    """The part of the run page that follows the run (fetched again on each event)."""
    run_id = _run_id(request)
    return HTMLResponse(_live(request, run_id), headers=HEADERS)


def _live(request: Request, run_id: str, unknown: bool = False) -> Markup:
    from ingest.log import EventLog

    source: data.Source = request.app.state.source
    base = request.scope.get("root_path", "")  # the links' prefix (engine.web.gate)
    if not EventLog(source.data_dir, run_id).exists():
        waiting = TEMPLATES.get_template("run_waiting.html")
        return Markup(waiting.render(run_id=run_id, data_dir=source.data_dir, unknown=unknown))
    try:
        runs = source.collection()
        shown = data.run_page(runs, run_id)
        drawings = drawn_trees(runs, run_id)
    except ProjectError as err:
        return Markup(TEMPLATES.get_template("run_waiting.html").render(run_id=run_id, problem=str(err)))
    drawings = [(t, Markup(svg), n) for t, svg, n in drawings]  # the report's drawing: escaped where it is made
    live = TEMPLATES.get_template("run_live.html")
    return Markup(live.render(run_id=run_id, base=base, drawings=drawings, legend=Markup(LEGEND), **shown))


def tree(request: Request) -> HTMLResponse:
    run_id, tree_id = _run_id(request), request.path_params["tree_id"]
    try:
        runs = request.app.state.source.collection()
        shown = data.tree_page(runs, run_id, tree_id)
        drawings = drawn_trees(runs, run_id, tree_id)
    except ProjectError as err:
        return problem(request, str(err))
    if shown["tree"] is None:
        return problem(request, f"run {run_id!r} has no tree {tree_id!r}")
    turns: dict[str, list] = {}
    for t in shown["turns"]:
        turns.setdefault(t["edge_id"], []).append(t)
    calls: dict[tuple[str, int], list] = {}
    for c in shown["calls"]:
        calls.setdefault((c["edge_id"], c["turn"]), []).append(c)
    through: dict[str, list] = {}
    for p in shown["paths"]:
        for node_id in p["node_ids"]:
            through.setdefault(node_id, []).append(p)
    shown |= {"turns": turns, "calls": calls, "through": through}
    return page(
        request,
        "tree.html",
        run_id=run_id,
        tree_id=tree_id,
        drawing=Markup(drawings[0][1]) if drawings else None,
        legend=Markup(LEGEND),
        **shown,
    )


def compare(request: Request) -> HTMLResponse:
    """A node's finished attempts side by side, from the conversation they were forked from."""
    run_id, tree_id = _run_id(request), request.path_params["tree_id"]
    node_id = request.query_params.get("node")
    if not node_id:
        return problem(request, "a compare page needs a run, a tree and ?node=", 400)
    try:
        shown = request.app.state.source.attempts(run_id, tree_id, node_id)
    except ProjectError as err:
        return problem(request, str(err))
    if not shown["attempts"]:
        return problem(request, f"node {node_id!r} of tree {tree_id!r} has no finished attempt")
    edges = [a["edge_id"] for a in shown["attempts"]]
    source: data.Source = request.app.state.source
    try:
        runs = source.collection()
        found = data.failures(runs, run_id, tree_id, edges)
        evals = data.turn_evals(runs, run_id, tree_id, edges)
    except ProjectError as err:
        return problem(request, str(err))
    feedback = source.feedback(run_id, set(evals))
    for a in shown["attempts"]:
        col = a["edge_id"].rsplit("/", 1)[1]
        items = [dict(it) for it in a["messages"] or []]
        for it, after in zip(items, [*items[1:], None], strict=True):
            it["ends"] = after is None or after["owner"] != it["owner"]
            it["eval"] = evals.get(tuple(it["owner"])) if it["ends"] else None
            it["feedback"] = feedback.get(tuple(it["owner"])) if it["ends"] else None
        a["failed"], a["first_failure"] = data.mark_failures(items, found, lambda it, col=col: f"{col}-m{it['idx']}")
        a["shown"] = items
    return page(request, "compare.html", run_id=run_id, tree_id=tree_id, node_id=node_id, **shown)


def compare_paths(request: Request) -> HTMLResponse:
    """Two to four paths of a tree (selected or not) side by side from where their conversations part."""
    run_id, tree_id = _run_id(request), request.path_params["tree_id"]
    leaves = list(dict.fromkeys(request.query_params.getlist("leaf")))
    if not 2 <= len(leaves) <= 4:
        return problem(request, "comparing paths needs a run, a tree and two to four ?leaf= (paths of the tree)", 400)
    source: data.Source = request.app.state.source
    try:
        shown = source.paths(run_id, tree_id, leaves)
        costs = data.path_costs(source.collection(), run_id, tree_id)
    except ProjectError as err:
        return problem(request, str(err))
    return page(request, "compare_paths.html", run_id=run_id, tree_id=tree_id, costs=costs, **shown)


def path(request: Request) -> HTMLResponse:
    run_id = _run_id(request)
    tree_id, leaf_id = request.query_params.get("tree"), request.query_params.get("leaf")
    selection = request.query_params.get("selection") or None
    if not tree_id or not leaf_id:
        return problem(request, "a path page needs a run, ?tree= and ?leaf=", 400)
    source: data.Source = request.app.state.source
    try:
        sample, conv = source.sample(run_id, tree_id, leaf_id, selection)
        rows = data.path_rows(source.collection(), run_id, tree_id, leaf_id)
    except ProjectError as err:
        return problem(request, str(err))
    meta = sample["metadata"]
    turns = {(t["edge_id"], t["turn"]): t for t in meta["turns"]}
    feedback = source.feedback(run_id, set(turns))
    # The messages in order, each with the turn it belongs to; a turn's eval after its last message.
    system = len(sample["messages"]) - len(conv.owners)
    items = []
    owners = ["start", *[None] * system, *conv.owners, "end"]  # (system messages belong to no turn)
    for i, message in enumerate(sample["messages"]):
        before, owner, after = owners[i : i + 3]
        ends = owner is not None and after != owner
        items.append(
            {
                "message": message,
                "owner": owner,
                "index": i,
                "eval": turns.get(owner) if ends else None,
                "feedback": feedback.get(owner) if ends else None,
                "starts": owner is not None and before != owner,
                "ends": ends,
            }
        )
    found = data.failures(source.collection(), run_id, tree_id, sorted({e for e, _turn in turns}))
    failed, first_failure = data.mark_failures(items, found, lambda it: f"m{it['index']}")
    return page(
        request,
        "path.html",
        run_id=run_id,
        tree_id=tree_id,
        leaf_id=leaf_id,
        items=items,
        meta=meta,
        tools=json.loads(sample["tools"]),
        call_names=data.call_names(sample["messages"]),
        failed=failed,
        first_failure=first_failure,
        **rows,
    )


def tree_css(_request: Request) -> Response:
    """The report's styles of a tree's drawing (one drawing, one style)."""
    return Response(TREE_CSS, media_type="text/css", headers=HEADERS)


async def _no_such(request: Request, err: Exception) -> HTMLResponse:
    return problem(request, str(err), 404)


async def _failed(request: Request, err: Exception) -> HTMLResponse:
    """A page for what no route expected (the traceback goes to the server's log, not to the page)."""
    return problem(request, f"the server failed to answer this page: {type(err).__name__}: {err}", 500)


def create_app(data_dir: Path, token: str, host: str = "127.0.0.1") -> Starlette:
    """The app over ``data_dir``; ``token``: required of every request, whatever the ``host`` bound."""
    if not token:
        raise ValueError("serving needs a token")
    routes = [
        Route("/", collection),
        Route("/sql", sql.sql, methods=["GET", "POST"]),
        Route("/search", search_page),
        Route("/campaign/{name}", campaign),
        Route("/run/{run_id}", run),
        Route("/run/{run_id}/live", run_live),
        Route("/run/{run_id}/events", run_events),
        Route("/run/{run_id}/path", path),
        Route("/run/{run_id}/tree/{tree_id}", tree),
        Route("/run/{run_id}/tree/{tree_id}/compare", compare),
        Route("/run/{run_id}/tree/{tree_id}/paths", compare_paths),
        Route("/static/tree.css", tree_css),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]  # every route answers GET (and HEAD), the SQL page POST too (a query): no endpoint writes
    middleware = []
    if host in LOOPBACK:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]", "::1"]))
    middleware += [Middleware(TokenGate, token=token), Middleware(SameOrigin)]
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={NoSuchName: _no_such, Exception: _failed})
    app.state.source = data.Source(Path(data_dir))
    app.state.prepare_wait = PREPARE_WAIT
    return app
