"""Each rule once, held by behaviour: every place that shows a figure agrees with the figure computed
here from the raw events of a real sim run (issue 55)."""

from __future__ import annotations

import pytest

from engine.catalog import Catalog
from engine.collection import Collection
from ingest.reader import EventLog


def events(data, run_id, upto: int | None = None) -> list[dict]:
    rows = EventLog(data, run_id).read_table().to_pylist()
    return [r for r in rows if upto is None or r["seq"] <= upto]


def raw_tokens_and_cost(data, run_id, upto: int | None = None) -> tuple[int, float]:
    """A run's tokens (the four kinds) and cost, summed over the steps of its finished turns (up to a seq)."""
    rows = events(data, run_id, upto)
    finished = {(r["tree_id"], r["edge_id"], r["turn"]) for r in rows if r["kind"] == "turn_finished"}
    tokens, cost = 0, 0.0
    for r in rows:
        if r["kind"] == "step_finished" and (r["tree_id"], r["edge_id"], r["turn"]) in finished:
            kinds = ("tokens_input", "tokens_cache_read", "tokens_output", "tokens_reasoning")
            tokens += sum(r[k] or 0 for k in kinds)
            cost += r["cost"] or 0.0
    return tokens, cost


def raw_kept_edges(data, run_id, upto: int | None = None) -> int:
    """A run's valid edges: the edges whose last judgement kept them (kept or kept exempt), up to a seq."""
    last: dict[str, str] = {}
    for r in events(data, run_id, upto):
        if r["kind"] == "edge_judged":
            last[r["edge_id"]] = r["verdict"]
    return sum(v in ("kept", "kept_exempt") for v in last.values())


@pytest.mark.parametrize("run_id", ["rounds", "async"])
def test_a_runs_tokens_and_cost_agree_everywhere_they_are_shown(runs, run_id):
    from engine.web.data import collection_page

    tokens, cost = raw_tokens_and_cost(runs, run_id)
    assert tokens > 0
    catalog = Catalog.for_log(EventLog(runs, run_id), threads=1)
    (view,) = catalog.query("select tokens, cost from run_cost")
    assert view["tokens"] == tokens and view["cost"] == pytest.approx(cost)
    (spend,) = catalog.query("select tokens from campaign_spend")
    assert spend["tokens"] == tokens
    shown = {r["run_id"]: r for r in collection_page(Collection(runs, ["rounds", "async"]))["runs"]}
    assert shown[run_id]["tokens"] == tokens and shown[run_id]["cost"] == pytest.approx(cost)


def test_a_runs_spent_edges_agree_with_its_judged_edges(runs):
    catalog = Catalog.for_log(EventLog(runs, "rounds"), threads=1)
    (spend,) = catalog.query("select kept_edges from campaign_spend")
    assert spend["kept_edges"] == raw_kept_edges(runs, "rounds") > 0


def test_a_runs_stop_counts_agree_everywhere_they_are_shown(runs):
    from engine.watch import read_frame
    from engine.web.data import run_page

    counts: dict[str, int] = {}
    for r in events(runs, "rounds"):
        if r["kind"] == "tree_stopped":
            counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    assert sum(counts.values()) == 4  # (every root stopped once)
    catalog = Catalog.for_log(EventLog(runs, "rounds"), threads=1)
    assert {r["stop_reason"]: r["trees"] for r in catalog.query("select * from tree_stops")} == counts
    assert read_frame(catalog, "rounds", writing=False).stops == counts
    page = run_page(Collection(runs, ["rounds"]), "rounds")
    assert {r["stop_reason"]: r["trees"] for r in page["stops"]} == counts


def test_the_stage_order_is_defined_once():
    """The stage order was spelled 5 times: the macro stages() of views/_macros.sql for SQL (the views'
    and what Python runs), ingest.snapshots.STAGES for Python, and the two agree."""
    import re
    from pathlib import Path

    from conftest import catalog_of

    from ingest.snapshots import STAGES

    root = Path(__file__).resolve().parents[1]
    spelled = re.compile(r"""early['"]\s*,\s*['"]middle['"]\s*,\s*['"]late""")
    files = [root / "cli.py", *(p for d in ("engine", "ingest") for p in (root / d).rglob("*.py"))]
    files += sorted((root / "views").rglob("*.sql"))
    found = sorted(str(p.relative_to(root)) for p in files if spelled.search(p.read_text()))
    assert found == ["ingest/snapshots.py", "views/_macros.sql"]
    catalog = catalog_of([])
    assert tuple(catalog.query("select stages() as s")[0]["s"]) == STAGES
    quotas = catalog.query("select stage, stage_order, fill_order from int_snapshots__quotas order by stage_order")
    assert [(q["stage"], q["stage_order"], q["fill_order"]) for q in quotas] == [
        ("early", 1, 3),
        ("middle", 2, 1),
        ("late", 3, 2),
    ]
