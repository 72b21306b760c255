"""Conventions the project keeps: documented commands, staging views per event kind."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import ROOT

from cli import cli

README = (ROOT / "README.md").read_text()
VIEWS = (ROOT / "docs" / "VIEWS.md").read_text()


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_has_help_and_is_in_the_readme(name):
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0
    assert cli.commands[name].help and "Example:" in r.stdout
    assert f"python cli.py {name}" in README


def test_every_public_view_of_the_spec_is_documented():
    for view in ("snapshots", "trees", "turns", "edges", "nodes", "selections", "paths", "top_paths", "tool_calls"):
        assert f"| `{view}` |" in VIEWS


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in README


def test_nothing_cites_a_file_outside_the_repository():
    """The algorithm's documentation is docs/ALGORITHM.md, not a file beside the checkout."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cited = []
    for name in files:
        if name.startswith("data/") or not name.endswith((".py", ".sql", ".md", ".toml")):
            continue
        text = (ROOT / name).read_text()
        if any(mark in text for mark in ("SPEC" + " §", "SPEC" + ".md", "../" + "shared", "reference" + "/")):
            cited.append(name)
    assert cited == []
    assert "ALGORITHM §2" in (ROOT / "views" / "int_next_work.sql").read_text()


def test_every_declared_dependency_is_imported_by_the_code_that_needs_it():
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    code = "\n".join(p.read_text() for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))
    code += (ROOT / "cli.py").read_text()
    for requirement in project["dependencies"]:
        name = re.match(r"[A-Za-z0-9_-]+", requirement)[0].replace("-", "_")
        assert re.search(rf"^\s*(import|from) {name}\b", code, re.M), f"{name} is declared but never imported"


TOKEN_SUM = r"\btokens_[a-z_]+\b[^+]{0,12}\+[^+]{0,30}?\btokens_[a-z_]+\b"


def views_adding_token_kinds(texts: dict[str, str]) -> set[str]:
    """The views (name -> SQL) whose code, comments left out, adds one kind of tokens to another."""
    import re

    found = set()
    for name, text in texts.items():
        code = " ".join(re.sub(r"--[^\n]*", "", text).split())
        if re.search(TOKEN_SUM, code):
            found.add(name)
    return found


def test_the_total_of_tokens_is_summed_in_one_view():
    """int_turns__costs.tokens is the one total of a turn's tokens: every view that counts tokens sums it."""
    texts = {p.stem: p.read_text() for p in sorted((ROOT / "views").glob("*.sql"))}
    assert views_adding_token_kinds(texts) == {"int_turns__costs"}
    # the check sees a second total, however it is written
    for second in (
        "sum(c.tokens_input + c.tokens_cached + c.tokens_output + c.tokens_reasoning)",
        "coalesce(c.tokens_input, 0)\n    + coalesce(c.tokens_output, 0) as tokens",
        "tokens_output+tokens_reasoning",
    ):
        assert views_adding_token_kinds({"x": f"select {second} from int_turns__costs as c"}) == {"x"}
    one_total = "select sum(c.tokens) as tokens, sum(c.tokens_input) as tokens_input"
    assert views_adding_token_kinds({"x": one_total}) == set()


MAX_POSITIONAL = 6


def long_positional_signatures(source: str) -> list[str]:
    """The public functions of ``source`` taking more than MAX_POSITIONAL positional parameters."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            args = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
            if len(args) > MAX_POSITIONAL:
                found.append(f"{node.name}({', '.join(args)})")
    return found


def test_no_library_call_takes_more_than_six_positional_parameters():
    """export_runs took 12, in an order every caller had to keep: the rest are keyword-only."""
    found = [
        f"{path.relative_to(ROOT)}: {signature}"
        for folder in ("ingest", "engine")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for signature in long_positional_signatures(path.read_text())
    ]
    assert found == []
    assert long_positional_signatures("def f(a, b, c, d, e, f, g): pass") == ["f(a, b, c, d, e, f, g)"]
    assert long_positional_signatures("def f(a, b, c, d, e, f, *, g): pass") == []


def test_sql_text_is_quoted_in_one_place():
    """SQL string quoting was written 8 times (three of them named ``quoted``): ingest.text.sql_text."""
    import re

    doubling = re.compile(r"""replace\(\s*["']'["']\s*,\s*["']''["']\s*\)""")
    found = [
        str(path.relative_to(ROOT))
        for folder in ("ingest", "engine")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if doubling.search(path.read_text())
    ] + (["cli.py"] if doubling.search((ROOT / "cli.py").read_text()) else [])
    assert found == ["ingest/text.py"]
    assert doubling.search("""value.replace("'", "''")""") and doubling.search("""v.replace('a', 'b')""") is None

    from ingest.text import sql_text

    assert sql_text("it's") == "'it''s'"


def hand_quoted(source: str) -> list[int]:
    """The lines of the f-strings that quote a value into SQL by hand: ``f"'{v}'"`` (joined into a list),
    ``= '{v}'``, ``in ('{v}'`` or ``'{v}' as``; a message quoting a command is not SQL."""
    import ast
    import re

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.JoinedStr):
            continue
        parts = node.values
        text = [p.value if isinstance(p, ast.Constant) else None for p in parts]
        for i, part in enumerate(parts):
            before = text[i - 1] if i else ""
            after = text[i + 1] if i + 1 < len(parts) else ""
            if not (isinstance(part, ast.FormattedValue) and before and after):
                continue
            whole = len(parts) == 3 and before == after == "'"
            if whole or re.search(r"(=|\bin \()\s*'$", before) or re.match(r"'\s+as\s", after):
                found.append(node.lineno)
    return found


def test_no_sql_literal_is_quoted_by_hand():
    """Six passed the quoting guard above (a kind, a run id, strata and decision kinds, two settings): each
    value goes into SQL through ingest.text.sql_text."""
    files = [ROOT / "cli.py", *(p for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))]
    found = {str(p.relative_to(ROOT)): lines for p in files if (lines := hand_quoted(p.read_text()))}
    assert found == {}
    examples = [
        """", ".join(f"'{k}'" for k in kinds)""",
        """f"select * from t where kind = '{k}' and x\"""",
        """f"'{run}' as run_id, \"""",
        """f"x in ('{a}', 'b')\"""",
    ]
    assert [hand_quoted(e) for e in examples] == [[1], [1], [1], [1]]
    assert hand_quoted("""f"fix it and continue with '{hint}'; or skip it\"""") == []


def test_whether_a_run_finished_is_decided_in_one_view():
    """It was written 4 times in Python and 3 in views: int_run__finished is the one definition
    (audit_run_stopped reads the RunFinished itself as a decision point, not as the rule)."""
    sources = [ROOT / "cli.py", *(p for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))]
    readers = sorted(str(p.relative_to(ROOT)) for p in [*sources, *(ROOT / "views").glob("*.sql")])
    readers = [name for name in readers if "stg_run_finished" in (ROOT / name).read_text()]
    assert readers == ["views/audit_run_stopped.sql", "views/int_run__finished.sql"]
    assert (ROOT / "views" / "audit_run_stopped.sql").read_text().count("from stg_run_finished") == 1


def python_files_with(pattern: str) -> list[str]:
    """The library's Python files (cli.py, engine/, ingest/) whose text matches ``pattern``."""
    import re

    found = re.compile(pattern)
    sources = [ROOT / "cli.py", *(p for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))]
    return sorted(str(p.relative_to(ROOT)) for p in sources if found.search(p.read_text()))


POLICY = ["engine/campaign/policy.py"]


@pytest.mark.parametrize(
    ("rule", "pattern", "home"),
    [
        ("a campaign's tasks in order", r"order by task_order", ["engine/runset.py"]),
        ("which runs a command reads", r"is damaged:\\n|def expand\(|def is_campaign", ["engine/runset.py"]),
        ("whether a campaign stopped", r"rule = 'stop'|stg_campaign_stopped", []),
        # (in Python or in SQL it embeds: tests/test_campaign.py checks every place that shows it agrees)
        ("a campaign's spend", r"\[\"kept_edges\"\]\)?\s+for|sum\((coalesce\()?([a-z]\.)?kept_edges", POLICY),
        ("a run's stop counts: tree_stops", r"stop_reason,\s*count\(", []),
        ("a run's tokens and cost: run_cost", r"sum\((coalesce\()?([a-z]\.)?(tokens|cost)\b", []),
        ("a campaign's budget line", r"valid edges, \{", ["engine/render.py"]),
        ("the stages a run covers", r"as stages_covered", []),
    ],
)
def test_a_campaign_rule_is_written_once(rule, pattern, home):
    """Each was written 2-4 times in Python: now a view or one function."""
    assert python_files_with(pattern) == home, rule


def import_graph() -> dict[str, set[str]]:
    """Every module of cli.py, engine/ and ingest/ and the project modules it imports, anywhere in it (a
    function's import too: it runs as soon as the function is called; not one for type checkers alone)."""
    import ast

    files = [ROOT / "cli.py", *(p for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))]
    names = {}
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        found = set()
        tree = ast.parse(path.read_text())
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # ``from package import module`` imports that module; any other name, the module it is in
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module for a in node.names
                }
        graph[module] = {name for name in found if name in names and name != module}
    return graph


def test_the_house_has_no_circle_of_imports():
    """There were six (runs -> campaign -> loop -> exploration -> runs among them, and a teacher backend
    importing its package, which makes it): what two modules share lives below both."""
    import graphlib

    graph = import_graph()
    assert "ingest.writer" in graph["engine.runs"]  # (the walk sees an import in a function)
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"a circle of imports: {' -> '.join(err.args[1])}")
    assert set(order) >= set(graph)


# The one definition of each infrastructure rule, and the functions that may write it again, each with why.
ONE_DEFINITION = {
    "atomic write": ("ingest/paths.py", "write_atomically"),
    "same-file signature": ("ingest/paths.py", "file_signature"),
    "retry while the log moves": ("ingest/listing.py", "while_moving"),
    "directory replaced whole": ("ingest/paths.py", "replace_dir"),
}
ALSO = {
    # the log's publish: the record commits a part between its write and its rename (DECISIONS, "Event log")
    ("atomic write", "ingest/writer.py", "_publish"),
}
RENAMES = {"replace", "rename", "link"}
STAT_FIELDS = {"st_size", "st_mtime", "st_mtime_ns", "st_ctime", "st_ctime_ns", "st_ino", "st_dev"}


def _written(call) -> str | None:
    """The dumped expression of the file a call writes (open/os.open for writing, write_text/bytes), else None."""
    import ast

    func = call.func
    if isinstance(func, ast.Name) and func.id == "open" and call.args:
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"):
            return ast.dump(call.args[0])
    if isinstance(func, ast.Attribute) and func.attr == "open" and isinstance(func.value, ast.Name):
        return ast.dump(call.args[0]) if func.value.id == "os" and call.args else None
    if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes"):
        return ast.dump(func.value)
    return None


def _renamed(call) -> str | None:
    """The dumped source of a rename (os.replace/rename/link(SRC, ...), SRC.replace/rename(dest)), else None."""
    import ast

    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in RENAMES or call.keywords:
        return None
    if isinstance(func.value, ast.Name) and func.value.id == "os":
        return ast.dump(call.args[0]) if len(call.args) == 2 else None
    return ast.dump(func.value) if len(call.args) == 1 else None  # (str.replace takes two)


def infrastructure_rules_written_again(root) -> list[str]:
    """Where under ``root`` (cli.py, engine/, ingest/) a function writes one of ONE_DEFINITION's rules itself:
    a file written then renamed into place; a directory moved aside, another renamed in its place and the first
    removed; a tuple of two or more stat fields compared as a file's identity;
    a bounded ``for ... in range(...)`` loop that retries when a file vanished (catches FileNotFoundError or a
    ``Moved``) or sleeps between tries."""
    import ast

    found = []
    for path in [
        root / "cli.py",
        *(p for folder in ("ingest", "engine") for p in sorted((root / folder).rglob("*.py"))),
    ]:
        name = str(path.relative_to(root))
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            home = {rule for rule, (file, func) in ONE_DEFINITION.items() if (file, func) == (name, fn.name)}
            home |= {rule for rule, file, func in ALSO if (file, func) == (name, fn.name)}
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
            written = {w for w in map(_written, calls) if w}
            if "atomic write" not in home and any(_renamed(c) in written for c in calls if _renamed(c)):
                found.append(f"{name}:{fn.lineno} {fn.name}: an atomic write (a file written, then renamed)")
            moves = [c for c in calls if _renamed(c) and getattr(c.func.value, "id", "") == "os"]
            removes = "rmtree" in {getattr(c.func, "attr", "") for c in calls}
            if len(moves) > 1 and removes and "directory replaced whole" not in home:
                found.append(f"{name}:{fn.lineno} {fn.name}: a directory replaced whole (moved aside, removed)")
            for node in ast.walk(fn):
                fields = {e.attr for e in getattr(node, "elts", ()) if isinstance(e, ast.Attribute)} & STAT_FIELDS
                if isinstance(node, ast.Tuple) and len(fields) > 1 and "same-file signature" not in home:
                    found.append(f"{name}:{node.lineno} {fn.name}: a same-file signature ({', '.join(sorted(fields))})")
                if (
                    isinstance(node, ast.For)
                    and isinstance(node.iter, ast.Call)
                    and getattr(node.iter.func, "id", "") == "range"
                    and "retry while the log moves" not in home
                    and _retries(node)
                ):
                    found.append(f"{name}:{node.lineno} {fn.name}: a retry while the log moves")
    return found


LISTINGS = {"parts", "legacy_parts", "located", "list_parts", "read_record", "record", "source", "state"}


def _retries(loop) -> bool:
    """Whether a loop retries when a file it listed vanished: it catches FileNotFoundError or a ``Moved``, or
    it lists the log's parts and sleeps between tries."""
    import ast

    nodes = list(ast.walk(loop))
    caught = [ast.unparse(n.type) for n in nodes if isinstance(n, ast.ExceptHandler) and n.type is not None]
    calls = [ast.unparse(n.func).rpartition(".")[2] for n in nodes if isinstance(n, ast.Call)]
    return any("FileNotFoundError" in c or "Moved" in c for c in caught) or (
        "sleep" in calls and bool(LISTINGS & set(calls))
    )


def test_each_infrastructure_rule_is_written_once():
    """Atomic writes were written 10 ways (fsync in some), the same-file signature 6, the retry while a log
    moves 11 (bounds 3 to 50), a directory replaced whole 2: each is one function now (ONE_DEFINITION), which
    every caller calls."""
    assert infrastructure_rules_written_again(ROOT) == []


def test_the_decisions_are_a_map_read_in_half_an_hour():
    """docs/DECISIONS.md was 1,349 lines, 16.7k words of decisions, measurements and history (~73 minutes at
    229 words a minute): now at most 600 lines and 30 minutes, every topic in the index at its top
    (measurements live in benchmarks/README.md, history in git)."""
    import re

    text = (ROOT / "docs" / "DECISIONS.md").read_text()
    index = text.split("\n## ", 1)[0]
    topics = re.findall(r"^## (.+)$", text, re.M)
    assert len(text.splitlines()) <= 600 and len(text.split()) <= 30 * 229
    names = [t.split(" (")[0] for t in topics]
    assert names and all(f"[{name}](#" in index for name in names), names


def test_each_export_format_is_stated_once():
    """FORMATS was written twice (engine.export and the command's choices), the path formats tested by their
    names, and a format's title, description, view, order and row named in dicts keyed by the names in four
    places: engine.export_formats states each format once (a Format); a tuple, list or dict keyed by two or
    more format names anywhere else fails (card.py's TITLES and WHAT, supervised.py's views and export's
    row names on the commit before)."""
    import ast

    names = {"chat", "atif", "dpo", "kto", "steps"}
    files = [ROOT / "cli.py", *(p for folder in ("ingest", "engine") for p in (ROOT / folder).rglob("*.py"))]
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
            if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
                listed = {e.value for e in elts if isinstance(e, ast.Constant)}
                if len(listed & names) >= 2:
                    found.add(str(path.relative_to(ROOT)))
    assert sorted(found) == []
    from engine.export import FORMATS
    from engine.export_formats import BY_NAME, PATH_FORMATS, SUPERVISED_FORMATS

    assert FORMATS == PATH_FORMATS + SUPERVISED_FORMATS and set(FORMATS) == names == set(BY_NAME)
    assert all(BY_NAME[name].view and BY_NAME[name].order for name in SUPERVISED_FORMATS)


def test_a_selections_latest_record_is_chosen_in_one_macro():
    """Which record a selection id stands for (its latest: a reselection replaces it) was written in four views;
    the macro latest_record states it, and no view picks among a selection id's records itself."""
    import re

    picks = re.compile(r"partition\s+by[^)]*selection_id", re.IGNORECASE)
    texts = {p.name: p.read_text() for p in sorted((ROOT / "views").rglob("*.sql"))}
    assert [name for name, text in texts.items() if picks.search(text)] == ["_macros.sql"]
    # every view keyed by selection id that reads the recorded lists out of the decisions keeps the latest record
    # (the audits check every record at its own seq)
    decisions = re.compile(r"from\s+stg_(paths|supervision)_selected")
    keyed = re.compile(r"^-- grain:.*\bselection_id\b", re.MULTILINE)
    lists = [n for n, t in texts.items() if decisions.search(t) and "from_json" in t and keyed.search(t)]
    assert lists and all("latest_record(run_id, selection_id, seq)" in texts[name] for name in lists), lists


def derived_constructions(root) -> list[str]:
    """Where a module of ``root`` (cli.py, engine/, ingest/, benchmarks/) calls the class
    ``engine.derived.Derived``, under whatever name it imported it (``from engine.derived import Derived as D``,
    ``from engine import derived``, ``import engine.derived as d``, a relative import), as ``file:line``."""
    import ast

    files = [root / "cli.py", *(p for d in ("ingest", "engine", "benchmarks") for p in (root / d).rglob("*.py"))]
    found = []
    for path in files:
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[:-1]  # (a module's package; an __init__'s is itself)
        tree = ast.parse(path.read_text())
        names: set[str] = set()  # names the class is bound to
        modules: set[str] = set()  # dotted names the module engine.derived is bound to
        if parts == ["engine", "derived", "__init__"]:
            names.add("Derived")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                for alias in node.names:
                    if module == "engine.derived" and alias.name == "Derived":
                        names.add(alias.asname or alias.name)
                    elif f"{module}.{alias.name}" == "engine.derived":
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "engine.derived":
                        modules.add(alias.asname or "engine.derived")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (isinstance(func, ast.Name) and func.id in names) or (
                isinstance(func, ast.Attribute) and func.attr == "Derived" and ast.unparse(func.value) in modules
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_derived_state_is_built_in_at_most_two_places(tmp_path):
    """One Derived a process: it was built in ten places (serve's pages, watch, export, campaign watch and
    verify, opening a run), each re-hashing the views, opening a DuckDB instance and checking files anew. Now
    the door (engine.runset.Reader) builds it; the writer keeping a live run's state (which reads nothing)
    stores it through engine.derived.states.States, no catalog of its own."""
    homes = sorted({place.split(":")[0] for place in derived_constructions(ROOT)})
    assert homes == ["engine/runset.py"]
    assert len(derived_constructions(ROOT)) <= 2
    # The rule, not a spelling: every way of naming the class is found.
    (tmp_path / "engine" / "derived").mkdir(parents=True)
    (tmp_path / "cli.py").write_text("import engine.derived as d\nimport engine.derived\nd.Derived(1)\n")
    (tmp_path / "engine" / "a.py").write_text(
        "from engine.derived import Derived as D\nfrom engine import derived\n"
        "def f():\n    return D(1), derived.Derived(2), engine.derived.Derived(3)\n"
    )
    (tmp_path / "engine" / "derived" / "b.py").write_text("from . import Derived\nDerived(1)\nDerive(2)\n")
    found = derived_constructions(tmp_path)
    assert sorted(found) == ["cli.py:3", "engine/a.py:4", "engine/a.py:4", "engine/derived/b.py:2"]


def derived_importers(root) -> set[str]:
    """The modules of ``root``'s cli.py, engine/ and ingest/ outside engine/derived/ that import
    ``engine.derived`` or any module of it - anywhere, under ``if TYPE_CHECKING:`` too, relative or not."""
    import ast

    files = [root / "cli.py", *(p for d in ("ingest", "engine") for p in (root / d).rglob("*.py"))]
    found = set()
    for path in files:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[:2] == ["engine", "derived"]:
            continue
        package = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                named = [module, *(f"{module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            if any(n == "engine.derived" or n.startswith("engine.derived.") for n in named):
                found.add(str(path.relative_to(root)))
    return found


def test_derived_state_is_read_through_one_door():
    """Six modules outside engine/derived/ reached into it (the collection, serve's token, the web's data,
    export, campaign verify, the live writer); now two: the door every reader reads through (engine.runset:
    its Reader, a RunSet's states and files) and the live writer, which keeps its run's state (engine.mcts)."""
    assert derived_importers(ROOT) == {"engine/runset.py", "engine/mcts/explorer.py"}


def derived_loops(root) -> list[str]:
    """What in ``root``'s engine/derived/ points back up at the package, as ``file:line what``: a module of it
    importing ``engine.derived`` (the package, whose ``__init__`` imports its modules) or ``Derived``, anywhere
    in it; and an import under ``if TYPE_CHECKING:`` of a module that imports the importer back (one of the
    package's, or one importing any of them) - an import hidden to break a loop."""
    import ast

    def imported(path, tree) -> list[tuple[ast.stmt, str, list[str]]]:
        package = list(path.relative_to(root).with_suffix("").parts)[:-1]  # (an __init__'s is itself)
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                found.append((node, module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found += [(node, a.name, []) for a in node.names]
        return found

    def source(module: str):
        for candidate in (root / module.replace(".", "/")).with_suffix(".py"), root / module.replace(".", "/"):
            if candidate.is_file():
                return candidate
            if (candidate / "__init__.py").is_file():
                return candidate / "__init__.py"
        return None

    def derived(module: str) -> bool:
        return module == "engine.derived" or module.startswith("engine.derived.")

    found = []
    for path in sorted((root / "engine" / "derived").glob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(root)
        for node, module, names in imported(path, tree) if path.name != "__init__.py" else ():
            if module == "engine.derived" or (derived(module) and "Derived" in names):
                found.append(f"{where}:{node.lineno} imports {module} {', '.join(names)}".strip())
            elif module == "engine" and "derived" in names:
                found.append(f"{where}:{node.lineno} imports engine.derived")
        hidden = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
        for block in hidden:
            for node, module, _names in imported(path, ast.Module(body=block.body, type_ignores=[])):
                target = source(module)
                back = derived(module) or (
                    target is not None
                    and any(derived(m) for _n, m, _ in imported(target, ast.parse(target.read_text())))
                )
                if back:
                    found.append(f"{where}:{node.lineno} hides {module} behind TYPE_CHECKING")
    return found


def test_no_module_of_derived_points_back_at_the_package(tmp_path):
    """Derived was one class spread over its package's modules by passing ``self``: they imported it (and it
    them) behind ``if TYPE_CHECKING:``, a loop hidden. Now they are given an engine.derived.states.States (the
    stored states' verbs), the package's ``__init__`` imports them, and nothing points back up."""
    assert derived_loops(ROOT) == []
    # The rule, not a spelling: each way of pointing back is found.
    (tmp_path / "engine" / "derived").mkdir(parents=True)
    (tmp_path / "engine" / "other.py").write_text("import engine.derived.a\n")
    (tmp_path / "engine" / "derived" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.derived import Derived\n"
        "    from engine.other import x\n    from ingest.reader import EventLog\n"
    )
    (tmp_path / "engine" / "derived" / "b.py").write_text("def f():\n    from . import Derived\n")
    (tmp_path / "engine" / "derived" / "c.py").write_text("from engine import derived\nimport engine.derived\n")
    assert derived_loops(tmp_path) == [
        "engine/derived/a.py:3 imports engine.derived Derived",
        "engine/derived/a.py:3 hides engine.derived behind TYPE_CHECKING",
        "engine/derived/a.py:4 hides engine.other behind TYPE_CHECKING",
        "engine/derived/b.py:2 imports engine.derived Derived",
        "engine/derived/c.py:1 imports engine.derived",
        "engine/derived/c.py:2 imports engine.derived",
    ]
