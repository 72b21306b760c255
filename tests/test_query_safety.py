"""Issue 33's findings on queries: ``sql --timeout`` bounds the whole command (its output too)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_web import two_runs  # noqa: F401 - a fixture

from cli import cli

# ------------------------------------------------------- 9: sql's limits bound the whole command


@pytest.mark.parametrize("fmt", ["text", "--json", "--csv", "--parquet"])
def test_sql_timeout_covers_formatting_and_writing(two_runs, tmp_path, fmt):  # noqa: F811
    """DuckDB makes 20M (parquet: 10^10) rows of a range in no time; formatting them takes longer than
    a second on any machine. Stopped at the limit as a query is, nothing printed or written."""
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "result.parquet"
    rows = 10**10 if fmt == "--parquet" else 20_000_000
    args = {"text": [], "--parquet": ["--parquet", str(out)]}.get(fmt, [fmt])
    r = CliRunner().invoke(
        cli, ["--data", str(two_runs), "sql", f"select i from range({rows}) as t(i)", "--timeout", "1", *args]
    )
    assert r.exit_code == 1, r.output
    assert r.stderr == (
        "Error: the query ran past its time limit of 1 s and was stopped - nothing was written "
        "(give more with --timeout or $TEACHER_MCTS_SQL_TIMEOUT_S)\n"
    )
    assert r.stdout == "" and list(out.parent.iterdir()) == []  # nothing half-written


def test_sql_prints_every_format_as_before(two_runs):  # noqa: F811
    """The batched output is the output of before: a table, one JSON document, CSV (header when empty too)."""
    query = "select i, 'r' || i as s, [i, 7] as l, i / 3 as f from range(3) as t(i)"
    printed = {
        fmt: CliRunner().invoke(cli, ["--data", str(two_runs), "sql", query, *flag]).stdout_bytes.decode()
        for fmt, flag in (("text", []), ("json", ["--json"]), ("csv", ["--csv"]))
    }
    assert printed["text"] == (
        "i  s   l       f\n0  r0  [0, 7]  0.0000\n1  r1  [1, 7]  0.3333\n2  r2  [2, 7]  0.6667\n"
    )
    assert json.loads(printed["json"]) == [{"i": i, "s": f"r{i}", "l": [i, 7], "f": i / 3} for i in range(3)]
    assert printed["json"] == json.dumps(json.loads(printed["json"]), indent=2) + "\n"
    assert printed["csv"] == (
        'i,s,l,f\r\n0,r0,"[0, 7]",0.0\r\n1,r1,"[1, 7]",0.3333333333333333\r\n2,r2,"[2, 7]",0.6666666666666666\r\n'
    )
    empty = CliRunner().invoke(cli, ["--data", str(two_runs), "sql", "select 1 as x where false", "--csv"])
    assert empty.stdout_bytes == b"x\r\n"
