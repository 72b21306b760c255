"""The rows a count of a page stands for (issue 54: every number leads to its evidence), listed on the search
page (``/search?show=attempts`` or ``?show=paths``, when nothing is searched for) with its filters: run, task,
stage, tree, and an attempt's verdict or a path's being selected or ranked (``which``).

A count links here with the filters that are its own: the run page's pruned edges
(``run_progress``) to ``show=attempts&run=R&verdict=pruned``, a coverage cell (``coverage``: a
stratum's task or stage, its key ``none`` when the tree has none) to the paths or attempts of
that stratum. The rows are those of the views the counts add up (``edges``, ``paths``, with
their tree's task and stage from ``trees``), paged as the search's hits are.
"""

from __future__ import annotations

from typing import Any

from ingest.text import sql_text

ATTEMPTS = (
    "select e.run_id, e.tree_id, e.edge_id, e.parent_id, e.child_id, e.verdict, e.edge_score, e.tool_calls, "
    "e.tool_errors, t.task, t.stage from edges as e join trees as t using (run_id, tree_id) where {where} "
    "order by e.run_id, e.tree_id, e.started_seq, e.edge_id"
)
PATHS = (
    "select p.run_id, p.tree_id, p.leaf_id, p.selected, p.ranked, p.rank, p.path_score, p.depth, p.leaf_reason, "
    "t.task, t.stage from paths as p join trees as t using (run_id, tree_id) where {where} "
    "order by p.run_id, p.tree_id, p.rank nulls last, p.leaf_id"
)


def _where(query: Any, rows: str) -> str:
    """The condition of the list's filters (``rows``: the alias of the listed view)."""
    clauses = []
    for column, value in (
        (f"{rows}.run_id", query.run),
        (f"{rows}.tree_id", query.tree),
        ("coalesce(t.task, 'none')", query.task),  # (coverage's keys: a tree without one is 'none')
        ("coalesce(t.stage, 'none')", query.stage),
    ):
        if value:
            clauses.append(f"{column} = {sql_text(value)}")
    if query.show == "attempts" and query.verdict:
        clauses.append(f"e.verdict = {sql_text(query.verdict)}")
    if query.show == "paths" and query.which:
        clauses.append(f"p.{query.which}")  # (checked: selected or ranked)
    return " and ".join(clauses) or "true"


def listed(runs: Any, query: Any, shown: int) -> dict[str, Any]:
    """The rows ``query`` lists (its page of ``shown``) and how many there are, over the collection ``runs``."""
    sql = (ATTEMPTS if query.show == "attempts" else PATHS).format(
        where=_where(query, "e" if query.show == "attempts" else "p")
    )
    scope = query.run if query.run in runs.run_ids else None  # (one run's rows: its files alone)
    if query.run and scope is None:
        return {"rows": [], "total": 0}
    (total,) = runs.query(f"select count(*) as n from ({sql})", scope)[0].values()
    rows = runs.query(f"{sql} limit {shown} offset {(query.page - 1) * shown}", scope)
    for row in rows:
        if "edge_id" in row:
            row["anchor"] = row["edge_id"].rsplit("/", 1)[1]  # (its column on the compare page)
    return {"rows": rows, "total": total}
