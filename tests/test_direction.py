"""A task's direction travels with its roots: select-snapshots records it in every copy's
metadata.json, explore (and a campaign) explores them in it, a direction given that
contradicts it is refused, and every comparison of a minimising run points down.

The orientation checks recompute what they expect from the raw scores (the nodes' and
the edges' turn scores), not from the views' formulas."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SMALL, SNAPSHOTS

from cli import cli

ONE_EDGE = "[tree]\nroot_children = 1\nmax_depth = 1\n"


def invoke(data: Path, *args: object):
    return CliRunner().invoke(cli, ["--data", str(data), *map(str, args)])


def select(data: Path, out: Path, *args: object) -> None:
    r = invoke(data, "select-snapshots", SNAPSHOTS, out, "--task", "kernel-speedup", "--num-roots", 4, *args)
    assert r.exit_code == 0, r.output


def sql(data: Path, run_id: str, query: str) -> list[dict]:
    r = invoke(data, "sql", run_id, query, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def recorded_direction(data: Path, run_id: str) -> str:
    return sql(data, run_id, "select direction from run_config")[0]["direction"]


def metas(roots: Path) -> list[dict]:
    return [json.loads((f / "metadata.json").read_text()) for f in sorted(roots.iterdir())]


@pytest.fixture(scope="module")
def selection(tmp_path_factory) -> tuple[Path, Path]:
    """Four roots of the bundled run selected for a minimising task (run ``sel``): the data dir
    and the roots (tests add runs to it, and change only copies of the roots)."""
    base = tmp_path_factory.mktemp("selection")
    data, roots = base / "data", base / "roots"
    select(data, roots, "--direction", "minimize", "--run-id", "sel")
    return data, roots


@pytest.fixture(scope="module")
def minimised(selection, tmp_path_factory) -> tuple[Path, Path, str]:
    """The roots of ``selection`` explored without --direction (run ``min``): the data dir,
    the roots and explore's stderr."""
    data, roots = selection
    small = tmp_path_factory.mktemp("small") / "small.toml"
    small.write_text(SMALL)
    r = invoke(data, "explore", roots, "--config", small, "--run-id", "min")
    assert r.exit_code == 0, r.output
    return data, roots, r.stderr


@pytest.fixture
def one_edge(tmp_path) -> Path:
    path = tmp_path / "one.toml"
    path.write_text(ONE_EDGE)
    return path


def _refs(nodes: list[dict]) -> dict[str, float]:
    """ref(n): n's raw score, else its nearest ancestor's."""
    by_id = {n["node_id"]: n for n in nodes}

    def ref(node_id: str) -> float:
        node = by_id[node_id]
        return node["score"] if node["score"] is not None else ref(node["parent_id"])

    return {n: ref(n) for n in by_id}


def lowered(edges: list[dict], nodes: list[dict]) -> dict[str, bool | None]:
    """Per edge attempt: whether its best turn score (the lowest) is below its parent's reference
    score (None without a score): what improved means when lower is better."""
    refs = _refs(nodes)
    out: dict[str, bool | None] = {}
    for e in edges:
        scores = [s for s in (e["s1"], e["s2"]) if s is not None]
        out[e["edge_id"]] = min(scores) < refs[e["parent_id"]] if scores else None
    return out


@pytest.mark.slow
def test_a_minimising_selection_is_explored_minimising_end_to_end(minimised):
    data, roots, stderr = minimised
    assert {m["direction"] for m in metas(roots)} == {"minimize"}
    assert {m["selection_run"] for m in metas(roots)} == {"sel"}
    assert recorded_direction(data, "min") == "minimize"
    header = stderr.splitlines()[0]
    assert header.startswith("run min: exploring task kernel-speedup (minimize); interrupt and continue with: ")
    assert header.endswith("explore --resume min")

    nodes = sql(data, "min", "select tree_id, node_id, parent_id, score from nodes")
    edges = sql(data, "min", "select edge_id, parent_id, s1, s2, edge_score, improved, verdict from edges")
    expected = lowered(edges, nodes)
    # edges: improved is a lower score than the parent's reference; edge_score the lowest turn score
    assert {e["edge_id"]: e["improved"] for e in edges} == expected
    assert sum(v is True for v in expected.values()) >= 5 and sum(v is False for v in expected.values()) >= 5
    for e in edges:
        scores = [s for s in (e["s1"], e["s2"]) if s is not None]
        assert e["edge_score"] == (min(scores) if scores else None), e
    # trees: the best score is the lowest node score
    best = {t["tree_id"]: t["best_score"] for t in sql(data, "min", "select tree_id, best_score from trees")}
    for tree_id, score in best.items():
        assert score == min(n["score"] for n in nodes if n["tree_id"] == tree_id and n["score"] is not None)

    # pairs under the run's default rule: the chosen is valued at least as the rejected, and
    # where their scores differ it is mostly the lower score that is chosen (explored as
    # maximising, most pairs chose the higher)
    pairs = sql(data, "min", "select chosen_id, rejected_id, chosen_value, rejected_value from pairs")
    assert pairs and all(p["chosen_value"] >= p["rejected_value"] for p in pairs)
    score = {e["edge_id"]: e["edge_score"] for e in edges}
    scored = [(score[p["chosen_id"]], score[p["rejected_id"]]) for p in pairs]
    scored = [(c, r) for c, r in scored if c is not None and r is not None and c != r]
    lower = sum(c < r for c, r in scored)
    assert lower > 2 * (len(scored) - lower), scored

    # the improved rule: every chosen attempt lowered the score and its rejected did not; a
    # label is good exactly when its attempt lowered the score
    r = invoke(data, "reselect", "min", "--rule", "improved", "--json")
    assert r.exit_code == 0, r.output
    chosen = json.loads(r.stdout)["selection_id"]
    where = f"where selection_id = '{chosen}'"
    pairs = sql(data, "min", f"select chosen_id, rejected_id from int_pairs__recorded {where}")
    assert pairs and all(expected[p["chosen_id"]] is True and not expected[p["rejected_id"]] for p in pairs)
    labels = sql(data, "min", f"select edge_id, label from int_labels__recorded {where}")
    assert labels and all(lab["label"] == bool(expected[lab["edge_id"]]) for lab in labels)
    assert {lab["label"] for lab in labels} == {True, False}

    # paths: max_score is the lowest node score on the path (root excluded), avg_score the mean;
    # a lower one ranks higher, so the best path of a root has the lowest max_score
    raw = {n["node_id"]: n["score"] for n in nodes}
    paths = sql(
        data,
        "min",
        "select tree_id, leaf_id, node_ids, max_score, max_score_rank, avg_score, avg_score_rank, selected "
        "from paths where ranked",
    )
    assert paths
    for p in paths:
        scores = [raw[n] for n in p["node_ids"][1:]]
        assert p["max_score"] == min(scores) and p["avg_score"] == pytest.approx(sum(scores) / len(scores))
    for tree_id in best:
        ranked = [p for p in paths if p["tree_id"] == tree_id]
        top = max(ranked, key=lambda p: p["max_score_rank"])
        assert top["max_score"] == min(p["max_score"] for p in ranked)
        for a in ranked:
            for b in ranked:
                if a["max_score"] < b["max_score"]:
                    assert a["max_score_rank"] > b["max_score_rank"], (a, b)
                if a["avg_score"] < b["avg_score"] - 1e-9:
                    assert a["avg_score_rank"] > b["avg_score_rank"], (a, b)
    top_paths = sql(data, "min", "select tree_id, leaf_id from top_paths")
    assert {(p["tree_id"], p["leaf_id"]) for p in top_paths} == {
        (p["tree_id"], p["leaf_id"]) for p in paths if p["selected"]
    }

    # a resume says the direction too
    r = invoke(data, "explore", "--resume", "min")
    assert r.exit_code == 0 and r.stderr.startswith("run min: finished already"), r.output


def test_a_direction_that_contradicts_the_roots_is_refused(selection, tmp_path, one_edge):
    data, roots = selection
    runs = sorted(p.name for p in (data / "runs").iterdir())
    r = invoke(data, "explore", roots, "--direction", "maximize", "--config", one_edge)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("Error: --direction is maximize, but the snapshots in ") and "Traceback" not in r.output
    assert f"{roots} were selected for a task to minimize (recorded in their metadata.json by run sel)" in r.stderr
    assert "leave it out, or give minimize" in r.stderr
    contrary = tmp_path / "contrary.toml"
    contrary.write_text('direction = "maximize"\n' + ONE_EDGE)
    r = invoke(data, "explore", roots, "--config", contrary)
    assert r.exit_code == 1 and r.stderr.startswith(f"Error: the direction in {contrary} is maximize, but "), r.output
    # the same, re-selecting from the copies (select-snapshots or explore --select)
    r = invoke(
        data, "select-snapshots", roots, tmp_path / "again", "--task", "kernel-speedup", "--direction", "maximize"
    )
    assert r.exit_code == 1 and r.stderr.startswith("Error: --direction is maximize, but the snapshots in "), r.output
    r = invoke(data, "explore", roots, "--select", "--task", "kernel-speedup", "--direction", "maximize")
    assert r.exit_code == 1 and "--direction is maximize, but" in r.stderr, r.output
    assert sorted(p.name for p in (data / "runs").iterdir()) == runs  # nothing recorded


@pytest.mark.slow
def test_the_direction_the_roots_were_selected_for_given_again_is_accepted(selection, tmp_path, one_edge):
    data, roots = selection
    r = invoke(data, "explore", roots, "--direction", "minimize", "--config", one_edge, "--run-id", "same")
    assert r.exit_code == 0, r.output
    assert recorded_direction(data, "same") == "minimize"
    r = invoke(
        data, "select-snapshots", roots, tmp_path / "again", "--task", "kernel-speedup", "--run-id", "re", "--json"
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["direction"] == "minimize", r.output
    assert {m["direction"] for m in metas(tmp_path / "again")} == {"minimize"}


@pytest.mark.slow
def test_roots_without_a_recorded_direction(selection, tmp_path, one_edge):
    """Roots made before the copies recorded it: the selection run's, when it is in the data dir and
    selected them; else as before (the CORAL config they carry, else maximize: here). Roots that record
    different directions are refused."""
    data, roots = selection
    legacy = tmp_path / "legacy"
    shutil.copytree(roots, legacy)
    for meta_path in legacy.glob("*/metadata.json"):
        meta = json.loads(meta_path.read_text())
        del meta["direction"]
        meta_path.write_text(json.dumps(meta))
    r = invoke(data, "explore", legacy, "--config", one_edge, "--run-id", "from-log")
    assert r.exit_code == 0, r.output
    assert "exploring task kernel-speedup (minimize)" in r.stderr and recorded_direction(data, "from-log") == "minimize"
    r = invoke(data, "explore", legacy, "--direction", "maximize", "--config", one_edge)
    assert r.exit_code == 1 and "(recorded in the log of run sel)" in r.stderr, r.output
    elsewhere = tmp_path / "elsewhere"  # no run sel there: as before, maximize
    r = invoke(elsewhere, "explore", legacy, "--config", one_edge, "--run-id", "old")
    assert r.exit_code == 0, r.output
    assert "exploring task kernel-speedup (maximize)" in r.stderr and recorded_direction(elsewhere, "old") == "maximize"

    mixed = tmp_path / "mixed"
    shutil.copytree(roots, mixed)
    first, *_ = sorted(mixed.glob("*/metadata.json"))
    first.write_text(json.dumps(json.loads(first.read_text()) | {"direction": "maximize"}))
    r = invoke(data, "explore", mixed, "--config", one_edge)
    assert r.exit_code == 1, r.output
    assert (
        f"Error: {mixed}: the snapshots were selected with different directions (maximize: {first.parent.name}; "
        in (r.stderr)
    )
    assert "minimize: " in r.stderr and "(+1 more)" in r.stderr and "--select" not in r.stderr
    first.write_text(json.dumps(json.loads(first.read_text()) | {"direction": "up"}))
    r = invoke(data, "explore", mixed, "--config", one_edge)
    assert r.exit_code == 1 and 'direction in metadata.json is "up", not maximize or minimize' in r.stderr


@pytest.mark.slow
def test_a_campaign_task_keeps_the_direction_its_source_was_selected_for(selection, tmp_path):
    _, roots = selection
    data = tmp_path / "data"
    body = (
        'policy = "fixed"\n[explore]\nselection = { num_roots = 2 }\ntree = { root_children = 1, max_depth = 1 }\n'
        f'[[tasks]]\nname = "k"\nsource = "{roots}"\n'
    )
    contrary = tmp_path / "contrary.toml"
    contrary.write_text(body + 'direction = "maximize"\n')
    r = invoke(data, "campaign", contrary)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"Error: task 'k': its direction is maximize, but the snapshots in {roots} ")
    assert "selected for a task to minimize" in r.stderr and not (data / "campaigns").exists()
    plain = tmp_path / "plain.toml"
    plain.write_text(body)
    r = invoke(data, "campaign", plain)
    assert r.exit_code == 0, r.output
    assert "created run plain-k (task k, minimize)" in r.stderr
    assert recorded_direction(data, "plain-k") == "minimize"
