"""Fuzzing: malformed outside material never gives a traceback, and what is recorded stays storable.

Snapshot folders (names, metadata.json, attempt JSON), OpenCode stream lines, what
``coral eval`` left (attempt JSON, printed result blocks), config TOML and command
lines, each with random malformations (hypothesis). Every case must end as a
recorded skip (a fact saying why), no result, or a clean error (``InputError``;
exit 1 or 2 on the command line) - and every fact must be storable in the log and
read back as it was stored. The counts are printed at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from conftest import REPORT, SNAPSHOTS, copy_run
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cli import cli
from engine.config import load_config
from engine.teachers import make_teacher
from ingest.coral_eval import EVAL_BLOCK, from_attempt, from_printed
from ingest.errors import InputError
from ingest.events import EvalFinished, Event
from ingest.integrity import verify_log
from ingest.log import EventLog
from ingest.opencode_stream import KNOWN_TYPES, ShellCall, StreamParser
from ingest.schema import JSON_FIELDS, from_row, to_arrow
from ingest.snapshots import read_snapshot, scan

pytestmark = pytest.mark.slow
CASES: Counter[str] = Counter()
EXITS: Counter[int] = Counter()  # of the command lines


def fuzz(cases: int) -> settings:
    """Hypothesis settings of a fuzz target: ``cases`` examples, no deadline (a loaded machine)."""
    return settings(
        max_examples=cases,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if CASES:
        shown = ", ".join(f"{name} {n}" for name, n in sorted(CASES.items()))
        if EXITS:
            shown += " - the command lines exited " + ", ".join(f"{n}x {code}" for code, n in sorted(EXITS.items()))
        REPORT["fuzz"] = f"fuzzing: {sum(CASES.values())} cases ({shown}): no traceback, every fact storable"


DUCKDB = duckdb.connect()


def storable(facts: list[Event]) -> None:
    """The facts go into the log's Arrow form, come back as stored (text made UTF-8), and
    DuckDB - which the views read them with - takes their JSON columns as JSON."""
    table = to_arrow(facts, "fuzz", 1, datetime.now(UTC))
    again = to_arrow([from_row(r) for r in table.to_pylist()], "fuzz", 1, datetime.now(UTC))
    assert again.drop_columns(["recorded_at"]).equals(table.drop_columns(["recorded_at"]))
    json_columns = [c for c in table.column_names if c in JSON_FIELDS]
    if json_columns:
        DUCKDB.register("facts", table)
        DUCKDB.execute("select " + ", ".join(f'json("{c}")' for c in json_columns) + " from facts").fetchall()
        DUCKDB.unregister("facts")


# ------------------------------------------------------------------ strategies

SURROGATES = st.sampled_from(["\ud800", "\udcff", "\ud83d", "\ude00", "\udc80"])
TEXT = st.one_of(
    st.text(max_size=12), st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), SURROGATES, st.text(max_size=4))
)
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT)
JSON = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=10
)


def dumps(value: object) -> str:
    return json.dumps(value, allow_nan=True)


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` cut short, with a character changed, inserted or removed."""
    i = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["cut", "change", "insert", "delete", "as_is"]))
    c = draw(st.characters())
    return {
        "cut": text[:i],
        "change": text[:i] + c + text[i + 1 :],
        "insert": text[:i] + c + text[i:],
        "delete": text[:i] + text[i + 1 :],
        "as_is": text,
    }[how]


# -------------------------------------------------------------- stream lines

VALID_LINES = [
    dumps({"type": "step_start", "sessionID": "ses_1", "part": {"type": "step-start"}}),
    dumps(
        {
            "type": "tool_use",
            "sessionID": "ses_1",
            "part": {
                "tool": "bash",
                "callID": "c1",
                "state": {
                    "status": "completed",
                    "input": {"command": "coral eval -m x"},
                    "output": "CORAL Eval (#1): 0.5\n",
                },
            },
        }
    ),
    dumps(
        {
            "type": "tool_use",
            "part": {
                "tool": "read",
                "id": "c2",
                "state": {"status": "error", "input": {"filePath": "/a"}, "error": "File not found"},
            },
        }
    ),
    dumps(
        {
            "type": "step_finish",
            "part": {
                "reason": "stop",
                "cost": 0.01,
                "tokens": {"total": 10, "input": 5, "output": 5, "reasoning": 0, "cache": {"read": 0, "write": 0}},
            },
        }
    ),
    dumps({"type": "text", "part": {"text": "done"}}),
    dumps({"type": "reasoning", "part": {"text": "hm"}}),
    dumps({"type": "error", "error": {"name": "APIError", "data": {"message": "boom"}}}),
]

TOOL_STATE = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["completed", "error", "running"]) | JSON,
        "input": JSON
        | st.fixed_dictionaries(
            {}, optional={"command": JSON, "filePath": JSON, "path": JSON, "pattern": JSON, "tool": JSON, "error": JSON}
        ),
        "output": JSON,
        "error": JSON,
    },
)
PART = st.fixed_dictionaries(
    {},
    optional={
        "tool": JSON | st.sampled_from(["bash", "read", "invalid", "skill", "glob"]),
        "callID": JSON,
        "id": JSON,
        "state": TOOL_STATE | JSON,
        "text": JSON,
        "reason": JSON,
        "cost": JSON,
        "tokens": JSON
        | st.fixed_dictionaries({}, optional={k: JSON for k in ("total", "input", "output", "reasoning", "cache")}),
    },
)
EVENT = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(KNOWN_TYPES)) | JSON},
    optional={"sessionID": JSON, "part": PART | JSON, "error": JSON, "timestamp": JSON},
)
LINES = st.one_of(
    st.text(),
    TEXT,
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    JSON.map(dumps),
    EVENT.map(dumps),
    st.sampled_from(VALID_LINES).flatmap(mutated),
)


@fuzz(1000)
@given(lines=st.lists(LINES, min_size=1, max_size=6))
def test_stream_lines_become_facts_or_recorded_skips(lines):
    CASES["stream lines"] += 1
    parser = StreamParser("T001", "T001/e1-1", 1)
    facts = [f for line in lines for f in parser.feed(line)]
    assert all(isinstance(f, Event) for f in facts)
    for f in facts:
        event(f.kind)
    storable(facts)
    assert parser.summary.lines == len(lines) and parser.summary.context_tokens >= -(2**63)


MISSING = object()  # a key left out


@st.composite
def broken(draw, valid: dict, wrong: dict) -> dict:
    """``valid`` with up to two of its entries replaced by a draw of what can go wrong with each."""
    keys = draw(st.lists(st.sampled_from(sorted(wrong)), max_size=2, unique=True))
    out = dict(valid)
    for key in keys:
        value = draw(wrong[key])
        if value is MISSING:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def serialized(value: dict) -> st.SearchStrategy[bytes]:
    """A JSON object as written, cut short or changed, or bytes that are not JSON at all."""
    text = dumps(value)
    return st.one_of(
        st.just(text), st.just(text), mutated(text), st.binary(max_size=30).map(lambda b: b.decode("latin-1"))
    ).map(lambda t: t.encode("utf-8", "surrogatepass"))


def breaks(*extra: object) -> st.SearchStrategy:
    return st.one_of(JSON, st.just(MISSING), *(st.just(x) for x in extra))


# ------------------------------------------------------------- eval results

SCORE_TOKENS = st.sampled_from(
    ["0.85", "-3", "nan", "NaN", "inf", "-inf", "1e999", "FAILED", "PENDING", "0x1p3", "1_0", "", "١٢", "0.5\n"]
) | st.text(max_size=6)


@st.composite
def eval_calls(draw) -> list[ShellCall]:
    """The shell calls of a turn: one ran the eval and printed its block, perhaps broken."""
    fields = draw(
        broken(
            {"n": 17, "score": "0.8523000000", "commit": "1a2b3c4d5e6f", "status": "improved", "feedback": "faster"},
            {
                "n": st.integers(-5, 10**30),
                "score": SCORE_TOKENS,
                "commit": TEXT,
                "status": TEXT,
                "feedback": st.none() | TEXT,
            },
        )
    )
    block = (
        f"CORAL Eval (#{fields['n']}): {fields['score']}\nCommit:  {fields['commit']}\n"
        f"Status:  {fields['status']}" + (f"\nFeedback: {fields['feedback']}" if fields["feedback"] else "")
    )
    block = draw(st.one_of(st.just(block), st.just(block), mutated(block)))
    command = draw(st.sampled_from(["coral eval -m 'tiling'", "coral eval -m 'tiling'", "ls", "coral"]))
    around = st.lists(st.builds(ShellCall, st.sampled_from(["coral eval -m y", "pytest"]) | TEXT, TEXT), max_size=2)
    return draw(around) + [ShellCall(command, draw(TEXT) + "\n" + block + "\n" + draw(TEXT))] + draw(around)


def eval_fact(result) -> EvalFinished:
    return EvalFinished(
        tree_id="T001",
        edge_id="T001/e1-1",
        turn=1,
        score=result.score,
        eval_status=result.status,
        source=result.source,
        feedback=result.feedback,
    )


@fuzz(800)
@given(calls=eval_calls())
def test_printed_eval_blocks_give_a_result_or_none(calls):
    CASES["eval output blocks"] += 1
    result = from_printed(calls, "coral eval")
    event("no result" if result is None else "no score" if result.score is None else "a score")
    if result is None:
        assert not any("coral eval" in c.command and EVAL_BLOCK.search(c.output) for c in calls)
        return
    assert result.score is None or abs(result.score) < float("inf")
    storable([eval_fact(result)])


ATTEMPT_WRONG = {
    "score": breaks(float("inf"), float("nan"), 10**400, "1.5", True, 1e308),
    "status": breaks(),
    "commit_hash": breaks(),
    "feedback": breaks(),
}


def attempt_body(commit: str) -> st.SearchStrategy[bytes]:
    valid = {"commit_hash": commit, "agent_id": "agent-1", "score": 1.25, "status": "improved", "feedback": "ok"}
    return st.one_of(
        broken(valid, ATTEMPT_WRONG).flatmap(serialized), JSON.map(lambda v: dumps(v).encode("utf-8", "surrogatepass"))
    )


@fuzz(800)
@given(body=attempt_body("1a2b3c4d5e6f"))
def test_an_attempt_json_gives_a_result_or_none(body):
    CASES["attempt JSON"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "1a2b3c4d5e6f.json"
        path.write_bytes(body)
        result = from_attempt(path)
    event("no result" if result is None else "no score" if result.score is None else "a score")
    if result is not None:
        assert result.score is None or abs(result.score) < float("inf")
        storable([eval_fact(result)])


# ---------------------------------------------------------- snapshot folders

NAME_CHARS = st.characters(exclude_characters="/\x00", exclude_categories=["Cs"])
FILE_NAME = st.one_of(
    st.text(NAME_CHARS, min_size=1, max_size=20).filter(lambda n: n not in (".", "..")),
    st.binary(min_size=1, max_size=12)
    .filter(lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b".."))
    .map(os.fsdecode),
)
HEX = st.text("0123456789abcdefABCDEF", min_size=1, max_size=40)
SNAPSHOT_NAME = st.one_of(
    st.builds(
        lambda i, agent, h: f"eval-{i}-{agent}-{h}",
        st.integers(0, 10**25).map(str) | st.just("007"),
        st.text(NAME_CHARS, min_size=1, max_size=8),
        HEX,
    ),
    FILE_NAME,
)
ENTRY = st.sampled_from(["dir", "file", None])
ATTEMPT_NAME = st.one_of(st.builds(lambda h: f"{h}.json", HEX), FILE_NAME, st.just("commit.json"))


@st.composite
def snapshot_folder(draw) -> dict:
    """A snapshot folder as CORAL writes one, with up to two things wrong (or not)."""
    index = draw(st.integers(1, 999_999))
    commit = draw(st.text("0123456789abcdef", min_size=40, max_size=40))
    meta = draw(
        broken(
            {"commit_hash": commit, "eval_ok": True, "eval_count": index, "agent_id": "agent-1"},
            {
                "commit_hash": breaks(commit[:7], commit.upper(), ""),
                "eval_ok": breaks(False, 1, "true"),
                "eval_count": breaks(),
                "agent_id": breaks(),
            },
        )
    )
    attempts = [(f"{commit}.json", draw(attempt_body(commit)))]
    attempts += draw(st.lists(st.tuples(ATTEMPT_NAME, attempt_body(commit[:12]) | st.just("dir")), max_size=2))
    valid = {
        "name": f"eval-{index:06d}-agent-1-{commit[:12]}",
        "is_dir": True,
        "meta": serialized(meta),
        "code": "dir",
        "shared": "dir",
        "attempts": attempts,
    }
    wrong = {
        "name": SNAPSHOT_NAME,
        "is_dir": st.just(False),
        "meta": st.sampled_from([None, "dir"]) | st.binary(max_size=30) | JSON.map(dumps),
        "code": ENTRY,
        "shared": ENTRY,
        "attempts": st.sampled_from([None, "file"]),
    }
    spec = draw(broken(valid, wrong))
    if not isinstance(spec["meta"], str | bytes | None):
        spec["meta"] = draw(spec["meta"])
    return spec


def write_entry(path: Path, what: object) -> None:
    if what == "dir":
        path.mkdir()
    elif what is not None:
        path.write_bytes(what if isinstance(what, bytes) else str(what).encode("utf-8", "surrogatepass"))


def make_folder(root: Path, spec: dict) -> Path:
    path = root / spec["name"]
    if not spec["is_dir"]:
        path.write_bytes(b"not a folder")
        return path
    path.mkdir()
    write_entry(path / "metadata.json", spec["meta"])
    write_entry(path / "code", spec["code"] if spec["code"] != "file" else b"x")
    write_entry(path / "shared", spec["shared"] if spec["shared"] != "file" else b"x")
    attempts = spec["attempts"]
    if spec["shared"] == "dir" and attempts is not None:
        if attempts == "file":
            (path / "shared" / "attempts").write_bytes(b"x")
            return path
        (path / "shared" / "attempts").mkdir()
        for name, body in attempts:
            target = path / "shared" / "attempts" / name
            if not target.exists():
                write_entry(target, body)
    return path


def make_folders(root: Path, specs: list[dict]) -> list[Path]:
    """The folders the file system accepts (a name may be too long for it: not a case)."""
    paths = []
    for spec in specs:
        try:
            paths.append(make_folder(root, spec))
        except OSError:
            continue
    return paths


@fuzz(400)
@given(folders=st.lists(snapshot_folder(), min_size=1, max_size=3, unique_by=lambda f: f["name"]))
def test_snapshot_folders_become_facts_with_a_recorded_skip_or_score_problem(folders):
    CASES["snapshot folders"] += len(folders)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "all_snapshots"
        root.mkdir()
        facts = [read_snapshot(p, "task") for p in make_folders(root, folders)]
        for fact in facts:
            event(
                f"skipped: {fact.skip_reason.split(' (')[0]}"
                if fact.skip_reason
                else "scored"
                if fact.score is not None
                else "no score"
            )
            assert fact.skip_reason or fact.score is not None or fact.score_problem, fact
            assert fact.score is None or abs(fact.score) < float("inf")
        storable(facts)
        try:
            storable(scan(root, "task"))
        except InputError as err:
            assert "not a snapshot run" in str(err)


# --------------------------------------------------------------- config TOML

VALID_CONFIG = [
    "seed = 5",
    "parallel = 4",
    'schedule = "rounds"',
    "backend_error_limit = 3",
    "[tree]",
    "max_depth = 3",
    "target_good_leaves = 4",
    "tool_error_prune = 0.3",
    "[soft]",
    "outcome = 0.3",
    "[paths]",
    "max = 0.5",
    "top_k = 3",
    "[knowledge]",
    'path_regex = "notes/"',
    'file_tools = ["read", "edit"]',
    "[backend_options]",
    "latency_s = 0.0",
    "token_growth = [8000, 25000]",
]
KEYS = [
    "seed",
    "parallel",
    "schedule",
    "backend",
    "task",
    "direction",
    "root_children",
    "max_children",
    "hard_token_limit",
    "alpha",
    "avg",
    "know",
    "command_regex",
    "num_roots",
    "calls_per_step",
    "bogus",
    "1",
]
LITERALS = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "9223372036854775807",
            "9223372036854775808",
            "1e999",
            "nan",
            "-inf",
            "1e6",
            "1e7",
            "true",
            '"async"',
            '"opencode"',
            '"minimize"',
            '"(["',
            '"a\\ud800"',
            "[1, 2]",
            "[3, 2]",
            '["read"]',
            "{a = 1}",
            "1979-05-27",
            "[]",
            "[[1]]",
            '""',
        ]
    ),
    st.integers().map(str),
    st.floats().map(repr),
    TEXT.map(json.dumps),
)
SECTIONS = st.sampled_from(
    ["tree", "soft", "q", "paths", "knowledge", "selection", "backend_options", "nope", "tree.deep", "[tree]"]
)


@st.composite
def config_text(draw) -> str:
    """A config file that works, with up to three lines changed, added, doubled or removed."""
    lines = list(VALID_CONFIG)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["value", "key", "section", "double", "delete", "mutate", "noise"]))
        key = lines[i].split(" = ")[0]
        if how == "value" and " = " in lines[i]:
            lines[i] = f"{key} = {draw(LITERALS)}"
        elif how == "key":
            lines.insert(i, f"{draw(st.sampled_from(KEYS))} = {draw(LITERALS)}")
        elif how == "section":
            lines.insert(i, f"[{draw(SECTIONS)}]")
        elif how == "double":
            lines.insert(i, lines[i])
        elif how == "delete":
            del lines[i]
        elif how == "mutate":
            lines[i] = draw(mutated(lines[i]))
        else:
            lines.insert(i, draw(st.text(max_size=12)))
    return "\n".join(lines)


@fuzz(800)
@given(text=config_text())
def test_a_config_file_is_a_valid_config_or_a_clean_error(text):
    CASES["config TOML"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            config = load_config(path, {})
        except InputError as err:
            assert str(err).startswith(f"{path}: ")
            event("refused by load_config")
            return
        try:
            make_teacher(config, Path(tmp) / "run").close()  # what explore checks before a run exists
        except InputError:
            event("refused by the backend")
            return
    event("a valid config")
    from ingest.events import RunStarted

    storable([RunStarted(command="explore", config=config.model_dump(mode="json"))])


# --------------------------------------------------------------- command lines


@pytest.fixture(scope="module")
def cli_data(runs, tmp_path_factory) -> Path:
    """A data dir holding a copy of one finished sim run (commands may append to it)."""
    data = tmp_path_factory.mktemp("fuzz") / "data"
    copy_run(runs, "rounds", data)
    return data


ODD = st.sampled_from(
    [
        "rounds",
        "nope",
        "T001",
        "T999",
        "-1",
        "0",
        "2",
        "1e999",
        "nan",
        "max=1,avg=nan",
        "max=1,max=2",
        "know=-1e7",
        "task,stage",
        "root",
        "select 1",
        "drop table trees",
        "copy trees to 'x.csv'",
        "select * from read_csv('/etc/passwd')",
        "attach 'x.db'",
        "select * from nope",
        "part-000000000001-000000000002-L0.parquet",
        "",
        "--",
        "-",
        "--help",
        "--json",
        "--csv",
        "--nope",
    ]
)
# Command lines that work (over a finished run, ``rounds``), to be broken by up to two changes.
# No template explores: a change could make it a whole exploration of the bundled run.
TEMPLATES = [
    ["replay", "rounds"],
    ["replay", "rounds", "--tree", "T001", "--json"],
    ["paths", "rounds", "--csv"],
    ["paths", "rounds", "--tree", "T002", "--selection", "paths-0"],
    ["views", "--json"],
    ["reselect", "rounds", "--weights", "max=0.5,avg=0.2,clean=0.15,know=0.15", "--top-k", "4"],
    ["reselect", "rounds", "--diversity", "0.5", "--json"],
    ["sql", "rounds", "select count(*) as n from trees"],
    ["sql", "select tree_id, n_eff_ratio from coverage", "--csv"],
    ["sql", "rounds", "select 1 as x", "--parquet", "out.parquet"],
    ["audit", "rounds", "--by", "task,stage,depth"],
    ["audit", "--json"],
    ["verify", "rounds"],
    ["quarantine", "rounds", "part-000000000001-000000000002-L0.parquet"],
    ["explore", "--resume", "rounds"],
    ["explore", "no-roots-here", "--task", "k", "--parallel", "2"],
    ["select-snapshots", "nowhere", "out", "--task", "t"],
    ["--version"],
    ["--help"],
]


def options_of(argv: list[str]) -> list[str]:
    command = cli.commands.get(argv[0]) if argv else None
    return [o for p in command.params for o in getattr(p, "opts", []) if o.startswith("-")] if command else []


@st.composite
def command_line(draw) -> list[str]:
    """A command line that works, with up to two tokens replaced, added, doubled or dropped."""
    argv = list(draw(st.sampled_from(TEMPLATES)))
    # Not serve: a command line of it that works serves until interrupted (tests/test_web.py runs it).
    commands = sorted(set(cli.commands) - {"serve"})
    token = st.one_of(ODD, TEXT, st.sampled_from(options_of(argv) or ["--json"]), st.sampled_from(commands))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(argv)))
        how = draw(st.sampled_from(["replace", "insert", "double", "drop"]))
        if how == "insert" or not argv:
            argv.insert(i, draw(token))
        elif how == "replace":
            argv[min(i, len(argv) - 1)] = draw(token)
        elif how == "double":
            argv.insert(i, argv[min(i, len(argv) - 1)])
        else:
            del argv[min(i, len(argv) - 1)]
    return argv


ARGV = command_line()


def test_command_lines_exit_0_1_or_2_without_a_traceback(cli_data, tmp_path):
    before = EventLog(cli_data, "rounds").tail_seq()
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a --parquet or select-snapshots output lands here
    try:
        run_command_lines(cli_data)
    finally:
        os.chdir(cwd)
    log = EventLog(cli_data, "rounds")
    assert verify_log(log).ok and log.tail_seq() >= before  # appended to (reselect), never broken
    r = CliRunner().invoke(cli, ["--data", str(cli_data), "replay", "rounds"])
    assert r.exit_code == 0 and "0 differ" in r.stdout, r.output


def run_command_lines(data: Path) -> None:
    @fuzz(200)
    @given(argv=ARGV)
    def check(argv):
        CASES["command lines"] += 1
        r = CliRunner().invoke(cli, ["--data", str(data), *argv])
        EXITS[r.exit_code] += 1
        assert r.exit_code in (0, 1, 2), (argv, r.exit_code, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (argv, repr(r.exception))
        assert "Traceback" not in r.output, (argv, r.output)
        if r.exit_code == 2:
            assert "Usage:" in r.stderr or "Error:" in r.stderr, (argv, r.output)

    check()


@pytest.mark.parametrize("seed", range(3))
def test_select_snapshots_over_malformed_folders_records_a_valid_run_or_none(tmp_path, seed):
    """The command over a corpus of random folders and copies of real ones."""
    data = tmp_path / "data"
    runs_made = []

    @fuzz(6)
    @given(
        folders=st.lists(snapshot_folder(), min_size=1, max_size=3, unique_by=lambda f: f["name"]),
        real=st.integers(0, 3),
        n=st.integers(0, 10**6),
    )
    def check(folders, real, n):
        CASES["select-snapshots corpora"] += 1
        corpus = tmp_path / f"corpus-{seed}-{n}"
        shutil.rmtree(corpus, ignore_errors=True)
        corpus.mkdir()
        for src in sorted(SNAPSHOTS.iterdir())[:real]:
            shutil.copytree(src, corpus / src.name)
        make_folders(corpus, folders)
        run_id = f"fuzz-{seed}-{len(runs_made)}-{n}"
        out = tmp_path / f"out-{run_id}"
        r = CliRunner().invoke(
            cli,
            [
                "--data",
                str(data),
                "select-snapshots",
                str(corpus),
                str(out),
                "--task",
                "t",
                "--run-id",
                run_id,
                "--num-roots",
                "2",
            ],
        )
        assert r.exit_code in (0, 1) and "Traceback" not in r.output, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        log = EventLog(data, run_id)
        if r.exit_code == 1:
            assert r.stderr.startswith("Error: ") and not log.exists(), r.output  # a failed command leaves no run
        else:
            assert verify_log(log).ok
            runs_made.append(run_id)

    check()
