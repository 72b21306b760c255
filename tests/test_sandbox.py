"""The log is inviolable from the read side (issue 23): no query through `sql` or the notebook
API can write a file, change the session's views or variables, read DuckDB's temporary
directory, or run without a time and memory limit; `sql --parquet` cannot overwrite a part;
one damaged run does not hide the healthy ones from an all-runs command."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import copy_run

from cli import cli
from engine.catalog.queries import RefusedQueryError
from engine.collection import Limits, QueryLimitError, open_runs
from ingest.errors import ProjectError
from ingest.integrity import verify_log
from ingest.log import EventLog

CROSS_JOIN = "select count(*) from range(1000000000) as a, range(100000) as b"  # 1e14 rows, little memory
MEMORY_HUNGRY = "select length(list(i)) from range(200000000) as t(i)"  # a 1.6 GB list: cannot spill


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


def hashes(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its SHA-256 (a file added or removed shows too)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


VIEW_ROWS = re.compile(r"derived/[^/]+/[^/]+/[^/]+/views/[a-z_0-9]+-[0-9a-f]{32}\.parquet")


def unchanged(before: dict[str, str], after: dict[str, str]) -> bool:
    """Every file is as it was; the only new ones are the rows of views a read derived and stored
    (``derived/<run>/<flavour>/<source>/views/<view>-<digest>.parquet``: a query naming a view no query
    named before adds its file)."""
    new = after.keys() - before.keys()
    return all(after.get(k) == v for k, v in before.items()) and all(VIEW_ROWS.fullmatch(k) for k in new)


def answers(runs) -> dict[str, list]:
    """What later queries answer: the ones a changed view, table or variable would alter."""
    return {
        q: runs.query(q)
        for q in (
            "select count(*) as n from trees",
            "select * from tool_calls order by all",
            "select run_id, tree_id, kept_edges, selected, top_path_score from trees order by all",
            "select run_id, count(*) as n from edges group by all order by all",
        )
    }


@pytest.fixture
def data(runs, tmp_path, monkeypatch) -> Path:
    """A copy of the session's two sim runs; the working directory is ``tmp_path`` (its .tmp/ too)."""
    copy = tmp_path / "data"
    for run in ("async", "rounds"):
        copy_run(runs, run, copy)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text("secret\n42\n")
    pq.write_table(pa.table({"x": [1]}), tmp_path / ".tmp" / "secret.parquet")
    return copy


def a_part(data: Path, run: str = "rounds") -> Path:
    parts = EventLog(data, run).parts()
    return parts[len(parts) // 2].path


# ---------------------------------------------------------------- the findings, one by one


def test_explain_analyze_of_a_copy_onto_a_part_is_refused_and_the_part_unchanged(data):
    """Finding 1: EXPLAIN ANALYZE has type EXPLAIN and runs the COPY it explains."""
    part = a_part(data)
    before = hashes(data)
    r = invoke(data, "sql", f"explain analyze copy (select 1 as x) to '{part}' (format parquet)")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "EXPLAIN ANALYZE" in r.stderr, r.output
    assert hashes(data) == before
    assert verify_log(EventLog(data, "rounds")).ok
    for plain in ("explain select count(*) from trees", "/* é */ EXPLAIN -- plan\n select count(*) from trees"):
        r = invoke(data, "sql", plain)  # a plain EXPLAIN of a SELECT still runs
        assert r.exit_code == 0 and "physical_plan" in r.stdout, r.output


def test_the_notebook_session_cannot_be_changed_by_a_query(data):
    """Finding 2: a fake trees view, tool_calls emptied, the watermark changed: later answers stay right."""
    runs = open_runs(data)
    before = answers(runs)
    for statement in (
        "explain analyze create or replace view trees as select 1 as n",
        "explain analyze delete from run_1.main.tool_calls",
        "explain analyze drop table run_2.main.trees",
        "explain analyze update run_1.main.trees set kept_edges = 0",
        "explain analyze set variable watermark = 0",
    ):
        with pytest.raises(ProjectError, match="only EXPLAIN of a SELECT"):
            runs.sql(statement)
        assert answers(runs) == before, statement
    runs.set(path_top_k=1)  # variables change through Collection.set, and the views follow
    assert runs.query("select max(selected) as k from trees")[0]["k"] <= 1
    runs.set(path_top_k=None)
    assert answers(runs) == before


def test_the_working_directorys_tmp_is_neither_readable_nor_writable(data, tmp_path):
    """Finding 3: DuckDB adds its temp directory (<cwd>/.tmp) to the allowed directories."""
    runs = open_runs(data)
    for statement in (
        "select * from read_csv('.tmp/secret.csv')",
        f"select * from read_parquet('{tmp_path}/.tmp/secret.parquet')",
        "select * from glob('.tmp/*')",
    ):
        with pytest.raises(ProjectError, match="Cannot access file"):
            runs.sql(statement)
    assert runs.query("select current_setting('temp_directory') as t") == [{"t": ""}]
    before = hashes(tmp_path / ".tmp")
    r = invoke(data, "sql", "explain analyze copy (select 1) to '.tmp/written.csv'")
    assert r.exit_code == 1 and hashes(tmp_path / ".tmp") == before, r.output


def test_a_query_is_stopped_at_its_time_limit_and_its_memory_limit(data, monkeypatch):
    """Finding 4: a cross join ran until Ctrl-C; a query took 5.1 GB of 23."""
    out = Path("result.parquet")
    r = invoke(data, "sql", CROSS_JOIN, "--timeout", "1", "--parquet", str(out))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith("Error: the query ran past its time limit of 1 s and was stopped"), r.stderr
    assert not out.exists() and not list(Path().glob(".result.parquet*"))  # nothing half-written
    r = invoke(data, "sql", MEMORY_HUNGRY, "--memory-limit", "64MB")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith("Error: the query needed more memory than its limit of 64MB"), r.stderr
    # The notebook API takes the same limits, from the environment too.
    monkeypatch.setenv("TEACHER_MCTS_SQL_TIMEOUT_S", "0.5")
    runs = open_runs(data)
    assert runs.limits.timeout_s == 0.5 and runs.limits.memory == 4 * 10**9
    with pytest.raises(ProjectError, match="time limit of 0.5 s"):
        runs.sql(CROSS_JOIN)
    assert runs.query("select count(*) as n from trees") == [{"n": 8}]  # the session still answers
    for bad in (["--timeout", "0"], ["--memory-limit", "lots"]):
        r = invoke(data, "sql", "select 1", *bad)
        assert r.exit_code == 1 and r.stderr.startswith("Error: "), r.output


def test_sql_parquet_refuses_a_part_the_data_dir_and_an_existing_file(data, tmp_path):
    """Finding 5: `sql --parquet PATH` overwrote whatever was at PATH, a published part included."""
    part = a_part(data)
    before = hashes(data)
    for target in (part, part.parent / "new.parquet", data / "runs" / "elsewhere.parquet"):
        r = invoke(data, "sql", "select 1 as x", "--parquet", str(target), "--overwrite")
        assert r.exit_code == 1 and "holds the runs of the data directory" in r.stderr, (target, r.output)
    assert hashes(data) == before
    existing = tmp_path / "mine.parquet"
    existing.write_bytes(b"not yet a result")
    r = invoke(data, "sql", "select 1 as x", "--parquet", str(existing))
    assert r.exit_code == 1 and "exists already - give --overwrite" in r.stderr, r.output
    assert existing.read_bytes() == b"not yet a result"
    r = invoke(data, "sql", "select 1 as x", "--parquet", str(existing), "--overwrite")
    assert r.exit_code == 0 and pq.read_table(existing).to_pylist() == [{"x": 1}], r.output


def test_report_and_export_refuse_an_output_inside_the_data_directory(data):
    """The same class as finding 5: `report --out <a part>` replaced the part with HTML."""
    part = a_part(data)
    before = hashes(data)
    for command in (
        ["report", "--out", str(part)],
        ["report", "--out", str(data / "runs" / "r.html")],
        ["export", "rounds", "--out", str(data / "runs" / "train")],
        ["export", "rounds", "--out", str(part.parent)],
        ["export", "rounds", "--out", str(data)],
    ):
        r = invoke(data, *command)
        assert r.exit_code == 1 and "holds the runs of the data directory" in r.stderr, (command, r.output)
    assert hashes(data) == before


@pytest.mark.slow
def test_one_damaged_run_does_not_hide_the_healthy_ones_from_any_all_runs_command(data, tmp_path):
    """Finding 18: every all-runs command read the healthy runs, names the damaged one, exits 1."""
    part = a_part(data, "async")
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    part.write_bytes(bytes(raw))
    problem = verify_log(EventLog(data, "async")).problem
    named = f"run async is damaged and was not read: {problem}"
    quarantine = f"python cli.py --data {data} quarantine async {part.name}"

    def damaged_named(r) -> None:
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert f"Error: {named}" in r.stderr and quarantine in r.stderr, r.stderr

    r = invoke(data, "replay")
    damaged_named(r)
    assert "run rounds: 4 trees" in r.stdout and "replay: 1 run," in r.stdout
    r = invoke(data, "audit", "--json")
    damaged_named(r)
    assert json.loads(r.stdout)["runs"] == ["rounds"]
    r = invoke(data, "sql", "select distinct run_id from trees", "--json")
    damaged_named(r)
    assert json.loads(r.stdout) == [{"run_id": "rounds"}]
    r = invoke(data, "report", "--out", str(tmp_path / "report.html"))
    damaged_named(r)
    assert "rounds" in (tmp_path / "report.html").read_text()
    r = invoke(data, "export", "--out", str(tmp_path / "train"))
    damaged_named(r)
    assert json.loads((tmp_path / "train" / "manifest.json").read_text())["runs"][0]["run_id"] == "rounds"
    assert open_runs(data).damaged[0].run_id == "async"  # the notebook API says so too
    # A damaged run named explicitly stays an error, and nothing is read.
    r = invoke(data, "sql", "async", "rounds", "select count(*) from trees")
    assert r.exit_code == 1 and r.stdout == "" and r.stderr.startswith("Error: ") and part.name in r.stderr
    # Once quarantined, the intact prefix is read like any run.
    assert invoke(data, "quarantine", "async", part.name).exit_code == 0
    assert invoke(data, "sql", "select count(distinct run_id) as n from trees", "--json").stdout.count('"n": 2')


# ------------------------------------------------------------- a corpus of hostile statements

EXPLAINED = [
    "copy (select 1 as x) to '{part}' (format parquet)",
    "copy (select * from run_1.main.trees) to '{log}/new.parquet'",
    "copy run_1.main.trees to '{log}/trees.csv'",
    "create table t as select 1",
    "create or replace view trees as select 1 as n",
    "create or replace view main.tool_calls as select * from run_1.main.tool_calls limit 0",
    "create macro pct(a, b) as 0",
    "create sequence s",
    "create secret (type s3, key_id 'k', secret 's')",
    "insert into run_1.main.log_tail select 0",
    "update run_1.main.log_tail set seq = 0",
    "update run_1.main.trees set kept_edges = 0",
    "delete from run_1.main.tool_calls",
    "truncate run_2.main.trees",
    "drop view trees",
    "drop table run_1.main.trees",
    "alter view trees rename to old_trees",
    "attach ':memory:' as other",
    "attach '{log}/x.duckdb' as other",
    "detach run_1",
    "install httpfs",
    "load httpfs",
    "set variable watermark = 0",
    "set variable asof_points = 'none'",
    "set enable_external_access = true",
    "set lock_configuration = false",
    "pragma enable_profiling",
    "call pragma_version()",
    "export database '{out}/db'",
    "checkpoint",
    "vacuum",
    "use run_1",
]
PLAIN = [
    "copy (select 1 as x) to '{part}' (format parquet)",
    "copy run_1.main.trees to '{log}/x.csv'",
    "set variable watermark = 0",
    "reset variable asof_points",
    "set lock_configuration = false",
    "reset lock_configuration",
    "set temp_directory = '.tmp'",
    "set memory_limit = '100GB'",
    "pragma memory_limit = '100GB'",
    "use run_1",
    "select * from read_csv('.tmp/secret.csv')",
    "select * from read_text('.tmp/secret.csv')",
    "select * from read_parquet('.tmp/*.parquet')",
    "select * from glob('.tmp/*')",
    "select * from glob('/tmp/*')",
    "select * from read_csv('{cwd}/.tmp/secret.csv')",
    "copy (select 1) to '.tmp/w.csv'",
    "select setseed(0.5)",
    "select * from query('select 1')",
    "select * from query_table('trees')",
    "select * from enable_profiling()",
    "select * from enable_logging()",
    "select * from checkpoint()",
    "select nextval('s')",
    "explain (format json) copy (select 1) to '{part}'",
    "explain analyse delete from run_1.main.tool_calls",
    "/* a comment */ explain -- another\n analyze delete from run_1.main.tool_calls",
    "/* ééééé, 漢字 */ explain analyze delete from run_1.main.tool_calls",
    "select 1; drop view trees",
    "pivot (select 1 as a, 'x' as b) on b using count(*)",
    "with x as (select 1) delete from run_1.main.tool_calls",
    "load '{log}/evil.duckdb_extension'",
    "attach '{part}' as p",
    CROSS_JOIN,
    MEMORY_HUNGRY,
]
CORPUS = [f"explain analyze {s}" for s in EXPLAINED] + PLAIN
# What stops each: refused before it runs, a limit, or (EXPLAIN ANALYZE of what DuckDB cannot
# explain) a parse error.
STOPPED = {CROSS_JOIN: "time limit", MEMORY_HUNGRY: "memory than its limit"}


@pytest.mark.slow
def test_a_corpus_of_hostile_statements_changes_no_file_and_no_later_answer(data, tmp_path):
    """Every statement is refused or stopped (a clean error, no traceback), through `sql` and the
    notebook API; afterwards every file under the data dir is byte-identical and every answer
    equals the one before."""
    assert len(CORPUS) >= 50
    out = tmp_path / "out"
    out.mkdir()
    log = EventLog(data, "rounds").log_dir
    fill = {"part": a_part(data), "log": log, "out": out, "cwd": tmp_path}
    for warm in ("select count(*) from trees", "select count(*) from audit_tree_stopped"):  # the states, derived
        assert invoke(data, "sql", warm).exit_code == 0
    before_files, before_out = hashes(data), hashes(out)
    limits = ["--timeout", "2", "--memory-limit", "64MB"]  # the last two statements hit them
    for statement in CORPUS:
        r = invoke(data, "sql", statement.format(**fill), *limits)
        assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.output, statement
        assert STOPPED.get(statement, "") in r.stderr, r.stderr
        assert unchanged(before_files, hashes(data)), statement
    for target in (fill["part"], log / "new.parquet", data / "runs" / "rounds" / "x.parquet"):
        r = invoke(data, "sql", "select 1 as x", "--parquet", str(target), "--overwrite")
        assert r.exit_code == 1 and "holds the runs of the data directory" in r.stderr, r.output
    runs = open_runs(data, limits=Limits.resolve("64MB", 2))
    before = answers(runs)
    for statement in CORPUS:
        with pytest.raises(ProjectError, match=STOPPED.get(statement)) as err:
            runs.sql(statement.format(**fill))
        assert isinstance(err.value, RefusedQueryError | QueryLimitError) or "Parser Error" in str(err.value)
        assert answers(runs) == before, statement
    assert unchanged(before_files, hashes(data)) and hashes(out) == before_out
    assert sorted(p.name for p in (tmp_path / ".tmp").iterdir()) == ["secret.csv", "secret.parquet"]
    fresh = open_runs(data)
    assert answers(fresh) == before


def test_a_query_of_sql_is_parsed_once_from_the_command_line_to_duckdb(data, monkeypatch):
    """It was parsed three times (the check, the collection's check, the relations it reads): now the
    check's one parse gives the relations too, and the collection runs the checked query."""
    from engine.catalog import queries

    parsed: list[str] = []
    real = queries.parse

    def counted(con, sql):
        parsed.append(sql)
        return real(con, sql)

    monkeypatch.setattr(queries, "parse", counted)
    query = "select run_id, count(*) as n from trees group by all order by all"
    done = invoke(data, "sql", query, "--json")
    assert done.exit_code == 0, done.output
    assert [row["run_id"] for row in json.loads(done.output)] == ["async", "rounds"]
    assert parsed.count(query) == 1
    explained = "explain " + query
    assert invoke(data, "sql", explained).exit_code == 0
    assert parsed.count(query) == 2 and explained not in parsed  # (an EXPLAIN's SELECT, parsed alone)


def test_a_query_made_to_look_checked_is_checked_again(data):
    """The collection takes a CheckedQuery as checked (parsed once): one made by hand, not by check_query,
    is checked as any text, so it cannot carry a statement the check refuses past it."""
    from engine.catalog.queries import CheckedQuery, check_query

    runs = open_runs(data)
    trees = runs.query(check_query("select count(*) as n from trees"))
    before = hashes(data)
    for text in ("select setseed(0.5)", "explain analyze select 1", "select 1; select 2"):
        forged = CheckedQuery(text, frozenset())
        with pytest.raises((RefusedQueryError, ProjectError)), runs.result(forged) as result:
            result.head(1)
    relabelled = CheckedQuery("select count(*) as n from trees", frozenset({"nodes"}))  # what it reads: not nodes
    assert runs.query(relabelled) == trees != []
    assert unchanged(before, hashes(data))


def test_the_notebook_api_hands_out_no_connection_that_could_write(data):
    """Issue 52, finding 8: ``runs.con`` was the collection's DuckDB connection, and DuckDB's allowed directories
    (the runs' logs) are writable: a COPY on it wrote a file into a run's log. No attribute of the collection is a
    connection now, and every query is checked."""
    import duckdb

    runs = open_runs(data)
    log = EventLog(data, "rounds").log_dir
    copy = f"copy (select 1 as x) to '{log}/x.parquet' (format parquet)"
    before = hashes(data)
    with pytest.raises(AttributeError, match=r"no DuckDB connection .*\.sql\(query\)"):
        runs.con.execute(copy)
    public = {n: v for n, v in vars(runs).items() if not n.startswith("_")}
    assert public and not [n for n, v in public.items() if isinstance(v, duckdb.DuckDBPyConnection)]
    for ask in (runs.sql, runs.query, runs.arrow):
        with pytest.raises(RefusedQueryError, match="not a statement of type COPY"):
            ask(copy)
    with pytest.raises(RefusedQueryError), runs.result(copy):
        pass
    assert hashes(data) == before and not (log / "x.parquet").exists()


@pytest.mark.slow
def test_the_notebook_api_works_as_views_md_shows_it(data):
    """VIEWS.md, "In a notebook": every line of its example, on the collection's checked queries alone."""
    import polars as pl

    runs = open_runs(data)
    assert {"coverage", "learnability", "trees"} <= set(runs.views)
    assert runs.coverage.filter(pl.col("stratum") == "stage").height > 0
    flagged = runs.sql("select run_id, tree_id, band from learnability where flagged")
    assert flagged.columns == ["run_id", "tree_id", "band"]
    runs.set(path_diversity=0.5)
    assert runs.trees.height == runs.query("select count(*) as n from trees")[0]["n"] > 0
    assert runs.damaged == []
    assert verify_log(EventLog(data, "rounds")).ok
