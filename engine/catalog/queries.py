"""SQL text parsed by DuckDB's own parser, once: a user's query checked read-only, and what a statement reads.

A query a user types (``sql``, ``serve``'s SQL page, ``Collection.query``) becomes a
:class:`CheckedQuery` before any run is read: one statement, a SELECT (or an EXPLAIN
of one), calling no function of ``REFUSED_FUNCTIONS``; its serialized tree also gives
the relations it reads, which the collection binds. A view's SQL is parsed by the same
walker for the relations it reads (``catalog.definitions``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ingest.errors import InputError, ProjectError
from ingest.text import as_utf8

SELECT = duckdb.StatementType.SELECT
# Functions a SELECT may call that change the session (a seed, a sequence, DuckDB's own
# log) or run SQL given as a string (which the check below cannot see into). The ones
# that change configuration (profiling, logging, grammar extensions) are refused by
# the locked configuration as well.
REFUSED_FUNCTIONS = frozenset(
    {
        "query",
        "query_table",
        "json_execute_serialized_sql",
        "setseed",
        "nextval",
        "setval",
        "write_log",
        "checkpoint",
        "force_checkpoint",
        "truncate_duckdb_logs",
        "enable_profiling",
        "disable_profiling",
        "enable_logging",
        "disable_logging",
        "add_grammar_extension",
        "remove_grammar_extension",
        "create_external_resource",
        "register_external_resource",
        "register_external_resource_type",
        "deregister_external_resource",
        "destroy_external_resource",
    }
)


class QueryError(ProjectError):
    """A query over the views failed (DuckDB's message, and the query)."""


class RefusedQueryError(InputError):
    """A query that is not read-only, or reads outside the runs' logs; nothing was run."""


def first_line(err: Exception) -> str:
    """The first line of an error's message (DuckDB's carry context lines after it)."""
    return str(err).strip().splitlines()[0]


@dataclass(frozen=True)
class Parsed:
    """What a serialized statement names: the functions it calls (lower case) and the relations it reads
    (views, tables: its own CTEs left out)."""

    functions: frozenset[str]
    relations: frozenset[str]


_CHECKED = object()  # what only check_query gives a CheckedQuery


@dataclass(frozen=True)
class CheckedQuery:
    """A user's query, checked: ``text`` as given (what runs), ``relations`` what its SELECT reads (the
    query's, or the one it EXPLAINs). One made other than by :func:`check_query` is checked again."""

    text: str
    relations: frozenset[str]
    seal: object = field(default=None, repr=False, compare=False)


def parse(con: duckdb.DuckDBPyConnection, sql: str) -> Parsed | str:
    """The functions and relations of one statement, or DuckDB's message when it cannot be parsed."""
    tree = json.loads(con.execute("select json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        return str(tree.get("error_message") or "cannot parse the SQL")
    functions: set[str] = set()
    tables: set[str] = set()
    ctes: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("class") == "FUNCTION" and isinstance(node.get("function_name"), str):
                functions.add(node["function_name"].lower())
            if node.get("type") == "BASE_TABLE" and "table_name" in node:
                tables.add(node["table_name"])
            cte_map = node.get("cte_map")
            if isinstance(cte_map, dict):
                ctes.update(entry.get("key") for entry in cte_map.get("map", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return Parsed(frozenset(functions), frozenset(tables - ctes))


def check_query(query: str | CheckedQuery, con: duckdb.DuckDBPyConnection | None = None) -> CheckedQuery:
    """``query`` checked read-only (RefusedQueryError, nothing run, otherwise); a checked query as it is.

    The statement's type is not enough: EXPLAIN ANALYZE has type EXPLAIN and runs the
    statement it explains, so an EXPLAIN must explain a SELECT, and a SELECT must call
    no function of REFUSED_FUNCTIONS. ``con``: any connection (it only parses; default
    a new one), so that ``sql`` refuses a statement before it reads any run.
    """
    if isinstance(query, CheckedQuery):
        if query.seal is _CHECKED:
            return query
        query = query.text
    con = con or duckdb.connect(config={"temp_directory": ""})
    if as_utf8(query) != query:  # DuckDB's binding raises TypeError on a lone surrogate
        raise QueryError(f"the query is not UTF-8 text: {as_utf8(query)!r} (U+FFFD for its other bytes)")
    statements = _statements(con, query)
    if len(statements) != 1:
        raise RefusedQueryError(f"give one query at a time ({len(statements)} statements given) - nothing was run")
    kind, body = statements[0].type, query
    if kind == duckdb.StatementType.EXPLAIN:
        body = _explained(query)
        try:
            inner = _statements(con, body)
        except QueryError:  # "ANALYZE <statement>", "(FORMAT json) <statement>": no statement alone
            inner = []
        if len(inner) != 1 or inner[0].type != SELECT:
            msg = (
                "only EXPLAIN of a SELECT is allowed (not EXPLAIN ANALYZE, which runs the statement it "
                "explains, nor EXPLAIN of anything else) - nothing was run"
            )
            raise RefusedQueryError(msg)
    elif kind != SELECT:
        msg = f"only a read-only query (a SELECT) is allowed, not a statement of type {kind.name} - nothing was run"
        raise RefusedQueryError(msg)
    parsed = parse(con, body)
    if isinstance(parsed, str):
        raise RefusedQueryError(f"the query cannot be checked ({parsed}) - nothing was run")
    refused = sorted(parsed.functions & REFUSED_FUNCTIONS)
    if refused:
        msg = (
            f"{refused[0]}() is not allowed in a query: it changes the session or runs SQL given as text - "
            "nothing was run"
        )
        raise RefusedQueryError(msg)
    return CheckedQuery(query, parsed.relations, _CHECKED)


def _statements(con: duckdb.DuckDBPyConnection, query: str) -> list:
    try:
        return con.extract_statements(query)
    except duckdb.Error as err:
        raise QueryError(first_line(err)) from err


def _explained(query: str) -> str:
    """The text after an EXPLAIN statement's first keyword (``EXPLAIN``), comments before it skipped."""
    raw = query.encode()  # the tokenizer's positions are byte offsets
    tokens = [pos for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]
    if len(tokens) < 2 or not raw[tokens[0] :].lower().startswith(b"explain"):
        return ""
    return raw[tokens[1] :].decode()
