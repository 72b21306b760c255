"""What the SQL page shows of a query's result: bounded in rows, columns and characters, whatever the query.

The page shows the first SHOWN_ROWS rows and SHOWN_COLUMNS columns, and a value longer than
CELL_CHARS characters (as text) cut to its first CELL_CHARS, marked, with the length of the
whole; rows stop once the page holds PAGE_CHARS characters of values. The cutting is done by
DuckDB, not after the fetch: the query runs wrapped in one that returns, for every column
whose values can be long (text, blobs, lists, structs, maps...), the value when it is short
and else its first characters and its length, so the server never holds a long value of a
page (a page of 501 values of 2 MB stays a page of 501 short texts). ``show all`` of a cut
value runs the query again for that one cell (:func:`one_cell`), itself cut at FULL_CHARS;
the cell's key (its place, its length and a digest of its first characters) tells whether it
is still the value shown (a query without ORDER BY may give its rows in another order).

A query that cannot be wrapped (an EXPLAIN) is fetched as it is, a batch bounded in bytes at
a time (``Result.batches``), and its values cut after the fetch.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any

import duckdb

from engine.catalog.queries import QueryError, check_query
from engine.results import SHORT_TYPES, QueryCancelledError, QueryLimitError

SHOWN_ROWS = 500  # rows of a query shown on the SQL page (and one more fetched, to know there are more)
SHOWN_COLUMNS = 200  # columns shown; the CSV has them all
CELL_CHARS = 500  # a longer value is shown cut to this many characters
NAME_CHARS = 200  # a longer column name is shown cut to this many
PAGE_CHARS = 1_000_000  # characters of values a page holds at most: rows stop there (>= SHOWN_COLUMNS * CELL_CHARS)
FULL_CHARS = 4_000_000  # characters of one value ``show all`` shows at most


def digest(text: str) -> str:
    """A short digest of a value's first CELL_CHARS characters (what a cut cell shows)."""
    return hashlib.sha256(text[:CELL_CHARS].encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class Cut:
    """A value shown cut: its first characters (``text``), the characters of the whole, and where it is."""

    text: str
    length: int
    row: int
    column: int

    @property
    def key(self) -> str:
        """What ``show all`` sends back: the cell's place, its length and the digest of what is shown."""
        return f"{self.row}:{self.column}:{self.length}:{digest(self.text)}"


@dataclass(frozen=True)
class Whole:
    """One value ``show all`` shows: its first FULL_CHARS characters (``text``) of ``length``."""

    name: str
    row: int
    column: int
    text: str
    length: int


@dataclass
class Shown:
    """What the page shows of a result."""

    columns: list[str]  # the columns shown (a long name cut)
    all_columns: int = 0  # the query's columns (more than shown: the first SHOWN_COLUMNS are)
    rows: list[list[Any]] = field(default_factory=list)  # values, or Cut
    more: bool = False  # the query has rows not shown
    full: bool = False  # ... left out because the page holds PAGE_CHARS characters
    cut: int = 0  # values shown cut
    chars: int = 0  # characters of the values shown

    def add(self, row: list[Any]) -> bool:
        """Show ``row`` if the page has room for it; False (and ``more``) if not."""
        chars = sum(len(v.text) if isinstance(v, Cut) else len(str(v)) for v in row)
        if len(self.rows) == SHOWN_ROWS or self.chars + chars > PAGE_CHARS:
            self.more, self.full = True, len(self.rows) < SHOWN_ROWS
            return False
        self.rows.append(row)
        self.chars += chars
        self.cut += sum(isinstance(v, Cut) for v in row)
        return True


NODE_COLUMNS = ("node_id", "parent_id", "child_id")  # a node of a tree (its row on the tree's page)


def id_links(columns: list[str], row: list[Any]) -> list[str | None]:
    """Where each cell of a result's row leads (a link without the server's prefix), or None: a node's id to its
    row on its tree's page, an edge's to its column on its node's compare page (the edge id is the node it
    starts from, ``/``, its column), a path's leaf to its page, a call's id (beside its edge's) to the call there.
    Only when the row names its run and tree (``run_id``, ``tree_id``): an id alone names nothing."""
    from urllib.parse import quote

    named = {c: v for c, v in zip(columns, row, strict=False) if isinstance(v, str) and v}
    run, tree = named.get("run_id"), named.get("tree_id")
    if not run or not tree:
        return [None] * len(row)
    at = f"/run/{quote(run, safe='')}"
    tree_page = f"{at}/tree/{quote(tree, safe='')}"

    def compare(edge: str, anchor: str = "") -> str | None:
        if "/" not in edge:
            return None
        parent, column = edge.rsplit("/", 1)
        return f"{tree_page}/compare?node={quote(parent, safe='')}#{quote(column + anchor, safe='')}"

    links: list[str | None] = []
    for column, value in zip(columns, row, strict=False):
        value = value if isinstance(value, str) and value else None
        if value is None:
            links.append(None)
        elif column in NODE_COLUMNS:
            links.append(f"{tree_page}#node-{quote(value, safe='')}")
        elif column == "edge_id":
            links.append(compare(value))
        elif column == "leaf_id":
            links.append(f"{at}/path?tree={quote(tree, safe='')}&leaf={quote(value, safe='')}")
        elif column == "call_id" and named.get("edge_id"):
            links.append(compare(named["edge_id"], f"-call-{value}"))
        else:
            links.append(None)
    return links


def body(query: str) -> str:
    """``query`` without the semicolons that end it (to be wrapped as a subquery)."""
    raw = query.encode()  # the tokenizer's positions are byte offsets
    tokens = [pos for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]
    while tokens and raw[tokens[-1] :].startswith(b";"):
        raw = raw[: tokens.pop()]
    return raw.decode()


def _explains(query: str) -> bool:
    tokens = [pos for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]
    return bool(tokens) and query.encode()[tokens[0] :].lower().startswith(b"explain")


def _alias(i: int) -> str:
    return f"_teacher_mcts_{i}"


def _wrapped(query: str, types: list[str], select: list[str]) -> str:
    """``query`` as a subquery, its first columns renamed ``_alias(i)``, under the ``select`` list."""
    names = ", ".join(_alias(i) for i in range(min(len(types), SHOWN_COLUMNS)))
    return f"select {', '.join(select)} from (\n{body(query)}\n) as _teacher_mcts({names})"


def bounded_query(query: str, types: list[str]) -> str:
    """The query the page runs: each shown column's value, and for one that can be long, also its cut and length
    (the value is NULL when it is long, the cut and length NULL when it is short)."""
    select = []
    for i, kind in enumerate(types[:SHOWN_COLUMNS]):
        value = _alias(i)
        if SHORT_TYPES.fullmatch(kind):
            select.append(value)
            continue
        text = f"cast({value} as varchar)"
        select += [
            f"case when length({text}) <= {CELL_CHARS} then {value} end",
            f"case when length({text}) > {CELL_CHARS} then left({text}, {CELL_CHARS}) end",
            f"case when length({text}) > {CELL_CHARS} then length({text}) end",
        ]
    return _wrapped(query, types, select)


def cell_query(query: str, types: list[str], row: int, column: int) -> str:
    """The query of one cell's whole value as text: its length and its first FULL_CHARS characters."""
    text = f"cast({_alias(column)} as varchar)"
    inner = _wrapped(query, types, [f"{text} as v"]) + f"\nlimit 1 offset {row}"
    return f"select length(v), left(v, {FULL_CHARS}) from ({inner})"


def _described(collection, checked, cancel) -> tuple[list[str], list[str]]:
    with collection.result(checked, cancel=cancel) as result:
        return result.described()


def _bound(stack: contextlib.ExitStack, collection, text: str, cancel):
    """The Result of the wrapped query ``text``, bound (closed with ``stack``); None when wrapping broke the
    query (it is then run as it is)."""
    try:
        with contextlib.ExitStack() as trying:  # (a failure to bind leaves through the result's block: a QueryError)
            result = trying.enter_context(collection.result(text, cancel=cancel))
            result.described()
            stack.push(trying.pop_all())
    except (QueryLimitError, QueryCancelledError):
        raise
    except QueryError:
        return None
    return result


def _names(names: list[str]) -> list[str]:
    return [n if len(n) <= NAME_CHARS else n[:NAME_CHARS] + "..." for n in names[:SHOWN_COLUMNS]]


def first_rows(collection, query: str, cancel) -> Shown:
    """What the page shows of ``query``'s result (QueryError and its kin as the query raises them)."""
    checked = check_query(query)  # refused before any run is read
    with contextlib.ExitStack() as stack:
        if not _explains(query):
            names, types = _described(collection, checked, cancel)
            result = _bound(stack, collection, bounded_query(query, types), cancel)
            if result is not None:
                return _wrapped_rows(result, names, types)
        return _plain_rows(stack.enter_context(collection.result(checked, cancel=cancel)))


def _wrapped_rows(result, names: list[str], types: list[str]) -> Shown:
    shown = Shown(_names(names), len(names))
    long = [not SHORT_TYPES.fullmatch(kind) for kind in types[:SHOWN_COLUMNS]]
    for batch in result.batches(SHOWN_ROWS + 1, limit=SHOWN_ROWS + 1):
        for values in batch:
            row, it = [], iter(values)
            for column, is_long in enumerate(long):
                value = next(it)
                if is_long and (cut := next(it)) is not None:
                    value = Cut(cut, next(it), len(shown.rows), column)
                elif is_long:
                    next(it)
                row.append(value)
            if not shown.add(row):
                return shown
    return shown


def _plain_rows(result) -> Shown:
    """The page's rows of a query fetched as it is (an EXPLAIN), each value cut after the fetch."""
    shown = Shown(_names(result.columns), len(result.columns))
    for batch in result.batches(SHOWN_ROWS + 1, limit=SHOWN_ROWS + 1):
        for values in batch:
            row = []
            for column, value in enumerate(values[:SHOWN_COLUMNS]):
                if isinstance(value, str) and len(value) > CELL_CHARS:
                    value = Cut(value[:CELL_CHARS], len(value), len(shown.rows), column)
                row.append(value)
            if not shown.add(row):
                return shown
    return shown


def one_cell(collection, query: str, row: int, column: int, cancel) -> Whole | None:
    """The value of one cell of ``query``'s result, run again (its first FULL_CHARS characters); None when the
    result has no such cell."""
    checked = check_query(query)
    with contextlib.ExitStack() as stack:
        if not _explains(query):
            names, types = _described(collection, checked, cancel)
            if not 0 <= column < min(len(names), SHOWN_COLUMNS):
                return None
            result = _bound(stack, collection, cell_query(query, types, row, column), cancel)
            if result is not None:
                found = result.head(1)
                return Whole(names[column], row, column, found[0][1] or "", found[0][0] or 0) if found else None
        return _plain_cell(stack.enter_context(collection.result(checked, cancel=cancel)), row, column)


def _plain_cell(result, row: int, column: int) -> Whole | None:
    names = result.columns
    if not 0 <= column < min(len(names), SHOWN_COLUMNS):
        return None
    skipped = 0
    for batch in result.batches(limit=row + 1):
        if skipped + len(batch) > row:
            value = batch[row - skipped][column]
            text = "" if value is None else str(value)
            return Whole(names[column], row, column, text[:FULL_CHARS], len(text))
        skipped += len(batch)
    return None
