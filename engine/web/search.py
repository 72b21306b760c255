"""Search every transcript of the collection: the runs' transcripts (:mod:`engine.derived.transcripts`)
filtered by their text and by what the views say of their attempts.

A search reads each run's transcript segments (checked, caught up as the run grows)
and the rows of ``edges`` and ``trees`` (and ``failures`` for the failed-calls filter,
which keeps each failed call's result, once; ``tool_calls`` for the knowledge filter)
through the collection, then finds the hits on a connection of its own in one scan of the
transcripts, keeping their keys (a temporary table of the hits, no text) to count, page and
group by attempt; a page's pieces are read back by their keys. The
text matches case-insensitively as a plain substring (no pattern syntax). A turn
recorded twice counts once: its last record. Each hit links to its message on the
compare page of the attempt's node (``#e<slot>-<attempt>-m<idx>``); the hits are
counted and listed by attempt too, and paged (``?page=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
from starlette.requests import Request
from starlette.responses import HTMLResponse

from engine.results import QueryLimitError
from engine.web.lists import listed
from engine.web.pages import page
from ingest.errors import ProjectError
from ingest.snapshots import STAGES
from ingest.text import sql_text

SHOWN = 200  # hits listed on a page (the count is of every hit; ?page= shows the others)
ATTEMPTS_SHOWN = 100  # attempts listed with their hits
AROUND = 90  # characters of context each side of a match
KINDS = ("text", "reasoning", "call", "result", "feedback")  # feedback: an eval's status, error and feedback
VERDICTS = ("kept", "kept_exempt", "pruned", "retry")
LISTS = ("attempts", "paths")
WHICH = ("selected", "ranked")
TEXT_FIELDS = ("q", "kind", "tool", "run", "task", "stage", "tree", "edge", "message", "verdict", "show", "which")

# The hits' keys (each piece once: a turn recorded twice, its last record - chosen among the hits, not among
# every piece), kept once and then counted, paged and grouped by attempt (each a scan of every transcript
# before: three of them, 1.1-1.7 s at ~1M events).
FOUND = """
create temp table hits as
with found as (
    select p.run_id, p.tree_id, p.edge_id, p.turn, p.seq, p.idx, p.kind, p.call_id
    from (select * from read_parquet({files}) union all by name select * from feedback) as p
    join attempts as e using (run_id, tree_id, edge_id)
    where {where}
)
select f.* exclude (turn) from found as f
left join (
    select run_id, edge_id, turn, max(seq) as seq from read_parquet({files}) group by all
) as latest using (run_id, edge_id, turn)
where f.kind = 'feedback' or f.seq = latest.seq
"""
ORDER = "order by run_id, tree_id, seq, idx, kind, call_id"
# A page of hits, whole: their pieces (text, tool, role, turn) read back by their keys, and their attempts.
SHOWN_HITS = """
with shown as (select * from hits {order} limit {limit} offset {offset}),
pieces as (
    select t.* from read_parquet({files}) as t where (t.run_id, t.seq) in (select (run_id, seq) from shown)
    union all by name
    select * from feedback where (run_id, seq) in (select (run_id, seq) from shown)
)
select p.*, e.parent_id, e.verdict, e.edge_score, e.task, e.stage
from shown as h
join pieces as p
    on p.run_id = h.run_id and p.seq = h.seq and p.kind = h.kind
    and p.idx is not distinct from h.idx and p.call_id is not distinct from h.call_id
join attempts as e on e.run_id = h.run_id and e.tree_id = h.tree_id and e.edge_id = h.edge_id
{order}
"""
# The attempts with the most hits, with what the list shows of each.
HIT_ATTEMPTS = """
select e.run_id, e.tree_id, e.edge_id, e.parent_id, e.verdict, e.edge_score, e.task, e.stage, h.hits
from (select run_id, tree_id, edge_id, count(*) as hits from hits group by all) as h
join attempts as e using (run_id, tree_id, edge_id)
order by h.hits desc, e.run_id, e.tree_id, e.edge_id
limit {limit}
"""


@dataclass
class Query:
    """What a search asks for (the form's fields, checked)."""

    q: str = ""
    kind: str = ""
    tool: str = ""
    run: str = ""
    task: str = ""
    stage: str = ""
    tree: str = ""
    edge: str = ""  # one attempt's (an edge id)
    message: str = ""  # failed calls with this error message (failures.message: as tool_error_messages groups)
    verdict: str = ""
    show: str = ""  # the rows a count stands for, listed from a view (engine.web.lists): attempts or paths
    which: str = ""  # paths: selected, ranked, or every candidate ('')
    min_score: float | None = None
    max_score: float | None = None
    errors: bool = False
    knowledge: bool = False
    page: int = 1
    problems: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, params: Any) -> Query:
        found = cls(**{k: (params.get(k) or "").strip() for k in TEXT_FIELDS})
        found.errors, found.knowledge = bool(params.get("errors") or found.message), bool(params.get("knowledge"))
        for name in ("min_score", "max_score"):
            text = (params.get(name) or "").strip()
            try:
                setattr(found, name, float(text) if text else None)
            except ValueError:
                found.problems.append(f"{name.replace('_', ' ')} {text!r} is not a number")
        text = (params.get("page") or "1").strip()
        if text.isdigit() and 1 <= int(text) <= 10**6:
            found.page = int(text)
        else:
            found.problems.append(f"page {text!r} is not a page number (1, 2, ...)")
        if found.kind and found.kind not in KINDS:
            found.problems.append(f"kind {found.kind!r} is not one of {', '.join(KINDS)}")
        if found.verdict and found.verdict not in VERDICTS:
            found.problems.append(f"verdict {found.verdict!r} is not one of {', '.join(VERDICTS)}")
        if found.show and found.show not in LISTS:
            found.problems.append(f"show {found.show!r} is not one of {', '.join(LISTS)}")
        if found.which and found.which not in WHICH:
            found.problems.append(f"which {found.which!r} is not one of {', '.join(WHICH)}")
        return found

    @property
    def asked(self) -> bool:
        """Whether there is anything to search for (a text, a tool name, failed calls or knowledge actions)."""
        return bool(self.q or self.tool or self.errors or self.knowledge)

    def at(self, page: int) -> dict[str, Any]:
        """The form's fields of this search at another page (a link's query)."""
        fields = {k: getattr(self, k) for k in TEXT_FIELDS}
        fields |= {k: getattr(self, k) for k in ("min_score", "max_score") if getattr(self, k) is not None}
        fields |= {k: "1" for k in ("errors", "knowledge") if getattr(self, k)}
        return {k: v for k, v in fields.items() if v != ""} | {"page": page}

    def where(self) -> tuple[str, list[Any]]:
        """The hits' condition and its parameters."""
        clauses, args = [], []
        if self.q:
            clauses.append("contains(lower(p.text), ?)")
            args.append(self.q.lower())
        for column, value in (("p.kind", self.kind), ("p.tool", self.tool), ("p.run_id", self.run)):
            if value:
                clauses.append(f"{column} = ?")
                args.append(value)
        for column, value in (
            ("e.task", self.task),
            ("e.stage", self.stage),
            ("p.tree_id", self.tree),
            ("p.edge_id", self.edge),
        ):
            if value:
                clauses.append(f"{column} = ?")
                args.append(value)
        if self.verdict:
            clauses.append("e.verdict = ?")
            args.append(self.verdict)
        if self.min_score is not None:
            clauses.append("e.edge_score >= ?")
            args.append(self.min_score)
        if self.max_score is not None:
            clauses.append("e.edge_score <= ?")
            args.append(self.max_score)
        if self.errors and not self.kind:  # a failed call once: its result (its call is another row)
            clauses.append("p.kind = 'result'")
        for flag, table in ((self.errors, "failed_calls"), (self.knowledge, "knowledge_calls")):
            if flag:
                message = " and c.message = ?" if self.message and table == "failed_calls" else ""
                clauses.append(
                    f"exists (select 1 from {table} as c where c.run_id = p.run_id and c.edge_id = p.edge_id "
                    f"and c.call_id = p.call_id{message})"
                )
                args += [self.message] if message else []
        return " and ".join(clauses) or "true", args


def search(source: Any, query: Query) -> dict[str, Any]:
    """The hits of ``query`` over the collection of ``source`` (:class:`engine.web.data.Source`)."""
    runs = source.collection()
    names = [query.run] if query.run else list(runs.run_ids)
    files = [str(f) for run_id in names if run_id in runs.run_ids for f in source.transcripts.files(run_id)]
    if not files:
        return {"hits": [], "total": 0, "attempts": [], "attempts_total": 0}
    tables = {
        "attempts": runs.arrow(
            "select e.run_id, e.tree_id, e.edge_id, e.parent_id, e.verdict, e.edge_score, t.task, t.stage "
            "from edges as e join trees as t using (run_id, tree_id)"
        )
    }
    tables["feedback"] = _feedback(source, [n for n in names if n in runs.run_ids])
    if query.errors:
        tables["failed_calls"] = runs.arrow(
            "select run_id, edge_id, call_id, message from failures where kind = 'tool'"
        )
    if query.knowledge:
        tables["knowledge_calls"] = runs.arrow("select run_id, edge_id, call_id from tool_calls where is_knowledge")
    where, args = query.where()
    listed = "[" + ", ".join(sql_text(f) for f in files) + "]"
    limits = source.limits  # (a query's: the hits' keys are held in memory, nothing spills)
    con = duckdb.connect(config={"temp_directory": "", "memory_limit": f"{limits.memory}B"})
    try:
        for name, table in tables.items():
            con.register(name, table)
        con.execute(FOUND.format(files=listed, where=where), args)
        (total, attempts_total) = con.execute(
            "select count(*), count(distinct (run_id, tree_id, edge_id)) from hits"
        ).fetchone()
        offset = (query.page - 1) * SHOWN
        rows = _rows(con.execute(SHOWN_HITS.format(files=listed, order=ORDER, limit=SHOWN, offset=offset)))
        attempts = _rows(con.execute(HIT_ATTEMPTS.format(limit=ATTEMPTS_SHOWN)))
    except duckdb.OutOfMemoryException as err:
        raise QueryLimitError(limits.memory_message(err)) from err
    finally:
        con.close()
    for row in rows:
        row["before"], row["match"], row["after"] = _snippet(row["text"], query.q)
        row["anchor"] = f"{row['edge_id'].rsplit('/', 1)[1]}-m{row['idx']}"
        if row["kind"] == "feedback":  # (the attempt's column: its turn's eval is at that turn's end)
            row["anchor"] = row["edge_id"].rsplit("/", 1)[1]
    for row in attempts:
        row["anchor"] = row["edge_id"].rsplit("/", 1)[1]
    return {"hits": rows, "total": total, "attempts": attempts, "attempts_total": attempts_total}


def _feedback(source: Any, run_ids: list[str]) -> Any:
    """Every eval's status, error and the grader's feedback as a searchable piece of its turn (kind ``feedback``,
    role ``grader``): read from the runs' logs (a heavy column no view holds), kept while each log is unchanged."""
    import pyarrow as pa

    from ingest.log import EventLog

    def read(run_id: str) -> list[dict[str, Any]]:
        pieces = []
        columns = ["seq", "tree_id", "edge_id", "turn", "eval_status", "error", "feedback"]
        for batch in EventLog(source.data_dir, run_id).scan_kind("eval_finished", columns):
            for r in batch.to_pylist():
                text = "\n".join(x for x in (f"eval {r['eval_status']}", r["error"], r["feedback"]) if x)
                pieces.append(
                    {k: r[k] for k in ("seq", "tree_id", "edge_id", "turn")}
                    | {"run_id": run_id, "idx": None, "role": "grader", "kind": "feedback"}
                    | {"tool": None, "call_id": None, "text": text}
                )
        return pieces

    rows = [p for run_id in run_ids for p in source.kept_rows(run_id, "search-feedback", lambda r=run_id: read(r))]
    schema = pa.schema(
        [("run_id", pa.string()), ("seq", pa.int64()), ("tree_id", pa.string()), ("edge_id", pa.string())]
        + [("turn", pa.int64()), ("idx", pa.int64()), ("role", pa.string()), ("kind", pa.string())]
        + [("tool", pa.string()), ("call_id", pa.string()), ("text", pa.string())]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _rows(result: Any) -> list[dict[str, Any]]:
    columns = [d[0] for d in result.description]
    return [dict(zip(columns, r, strict=True)) for r in result.fetchall()]


def _snippet(text: str, q: str) -> tuple[str, str, str]:
    """The text around the first match of ``q`` (the match apart, to be marked)."""
    at = text.lower().find(q.lower()) if q else -1
    if at < 0:
        return (text[: 2 * AROUND] + ("…" if len(text) > 2 * AROUND else "")), "", ""
    start, end = max(0, at - AROUND), min(len(text), at + len(q) + AROUND)
    before = ("…" if start else "") + text[start:at]
    return before, text[at : at + len(q)], text[at + len(q) : end] + ("…" if end < len(text) else "")


def search_page(request: Request) -> HTMLResponse:
    """The search form, and its hits when something was asked."""
    source = request.app.state.source
    query = Query.of(request.query_params)
    found: dict[str, Any] = {"hits": [], "total": 0, "attempts": [], "attempts_total": 0}
    error = "; ".join(query.problems) or None
    choices: dict[str, list] = {"runs": [], "tasks": [], "stages": list(STAGES)}
    try:
        runs = source.collection()
        choices["runs"] = list(runs.run_ids)
        choices["tasks"] = [r["task"] for r in runs.query("select distinct task from trees order by task")]
        if query.show and not query.asked and not error:
            found |= listed(runs, query, SHOWN)
        elif query.asked and not error:
            found = search(source, query)
    except ProjectError as err:
        error = str(err)
    return page(
        request,
        "search.html",
        query=query,
        error=error,
        shown=SHOWN,
        attempts_shown=ATTEMPTS_SHOWN,
        kinds=KINDS,
        verdicts=VERDICTS,
        lists=LISTS,
        which=WHICH,
        **found,
        **choices,
    )
