"""Path views (ALGORITHM §3) on a hand-computed tree, and reselection."""

from __future__ import annotations

import json

import pytest
from facts import catalog, edge, fanout, root

from engine.config import PathWeights, RunConfig, TreeConfig
from engine.selections import path_variables, selection_id, top_paths

CONFIG = RunConfig(task="t", tree=TreeConfig(max_depth=2, target_good_leaves=2))


def small_tree(extra=()):
    """root 1.0; T1.1 = 1.6 -> T1.1.1 = 1.8 (knowledge); T1.2 = 1.3 -> T1.2.1 = 1.25; T1.3 = 1.4."""
    events = [root(), *fanout(scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.1)))]
    events += edge("T1.1/e1-1", "T1.1", 1.7, 1.8, knowledge=True)
    events += edge("T1.2/e1-1", "T1.2", 1.2, 1.25)
    for e in extra:
        events += e
    return catalog(events, CONFIG)


def test_paths_rows_ranks_and_top_k_are_the_hand_computed_ones():
    cat = small_tree()
    rows = {r["leaf_id"]: r for r in cat.query("select * from paths")}
    assert set(rows) == {"T1.1.1", "T1.2.1", "T1.3"}
    assert rows["T1.3"]["node_ids"] == ["T1", "T1.3"]
    assert rows["T1.1.1"]["node_ids"] == ["T1", "T1.1", "T1.1.1"]
    got = {
        k: (
            r["avg_cleanliness"],
            r["avg_knowledge"],
            r["avg_score"],
            r["max_score"],
            r["avg_score_rank"],
            r["max_score_rank"],
        )
        for k, r in rows.items()
    }
    expected = {
        "T1.1.1": (1.0, 0.9, 1.7, 1.8, 1.0, 1.0),
        "T1.2.1": (1.0, 0.6, 1.275, 1.3, 0.0, 0.0),
        "T1.3": (1.0, 0.8, 1.4, 1.4, 0.5, 0.5),
    }
    for leaf, values in expected.items():
        assert got[leaf] == pytest.approx(values), leaf
    scores = {k: r["path_score"] for k, r in rows.items()}
    assert scores == pytest.approx(
        {
            "T1.1.1": 0.35 * 1 + 0.25 * 1 + 0.2 * 1 + 0.2 * 0.9,
            "T1.2.1": 0.2 * 1 + 0.2 * 0.6,
            "T1.3": 0.35 * 0.5 + 0.25 * 0.5 + 0.2 * 1 + 0.2 * 0.8,
        }
    )
    assert {k: r["rank"] for k, r in rows.items()} == {"T1.1.1": 1, "T1.3": 2, "T1.2.1": 3}
    assert rows["T1.3"]["leaf_reason"] == "stopped"
    # k = 6 > 3 candidates: all are selected.
    assert {r["leaf_id"] for r in cat.query("select * from top_paths")} == set(rows)


def test_other_weights_and_k_change_the_top_paths_as_computed():
    cat = small_tree()
    default = top_paths(cat, {"max": 0.35, "avg": 0.25, "clean": 0.2, "know": 0.2}, 2)
    assert [p["leaf_id"] for p in default] == ["T1.1.1", "T1.3"]
    # Cleanliness only: all three tie at 1.0, so the smallest leaf ids win.
    clean = top_paths(cat, {"max": 0.0, "avg": 0.0, "clean": 1.0, "know": 0.0}, 2)
    assert [p["leaf_id"] for p in clean] == ["T1.1.1", "T1.2.1"]
    # Knowledge only: 0.9, 0.8, 0.6.
    know = top_paths(cat, {"max": 0.0, "avg": 0.0, "clean": 0.0, "know": 1.0}, 3)
    assert [(p["leaf_id"], p["rank"]) for p in know] == [("T1.1.1", 1), ("T1.3", 2), ("T1.2.1", 3)]
    # The variables are gone afterwards: the view is back to the run config.
    assert len(cat.query("select * from top_paths")) == 3


def test_paths_through_a_null_score_are_not_ranked():
    cat = small_tree(extra=[edge("T1.3/e1-1", "T1.3", None, None)])
    rows = {r["leaf_id"]: r for r in cat.query("select * from paths")}
    assert rows["T1.3.1"]["ranked"] is False
    assert rows["T1.3.1"]["rank"] is None and rows["T1.3.1"]["path_score"] is None
    assert rows["T1.3.1"]["selected"] is False
    # Ranks are among the ranked paths only: two of them now.
    assert rows["T1.1.1"]["max_score_rank"] == 1.0 and rows["T1.2.1"]["max_score_rank"] == 0.0


def test_minimize_reports_raw_scores():
    config = RunConfig(task="t", direction="minimize", tree=TreeConfig(max_depth=1))
    events = [root(score=5.0), *fanout(scores=((4.5, 4.0), (4.8, 4.9), (4.2, 4.4)))]
    rows = {r["leaf_id"]: r for r in catalog(events, config).query("select * from paths")}
    assert rows["T1.1"]["max_score"] == 4.0 and rows["T1.1"]["avg_score"] == 4.0
    assert rows["T1.1"]["max_score_rank"] == 1.0 and rows["T1.2"]["max_score_rank"] == 0.0


def test_selection_ids_follow_from_parameters():
    a = selection_id({"max": 0.35, "avg": 0.25, "clean": 0.2, "know": 0.2}, 6)
    assert a == selection_id({"know": 0.2, "clean": 0.2, "avg": 0.25, "max": 0.35}, 6)
    assert a != selection_id({"max": 0.35, "avg": 0.25, "clean": 0.2, "know": 0.2}, 5)
    defaults = PathWeights()
    assert a == selection_id(
        {"max": defaults.max, "avg": defaults.avg, "clean": defaults.clean, "know": defaults.know},
        defaults.top_k,
    )


def test_path_variables_reset_even_on_error():
    cat = small_tree()
    weights = path_variables({"max": 1, "avg": 0, "clean": 0, "know": 0}, 1)
    with pytest.raises(RuntimeError), cat.variables.using(**weights):
        assert len(cat.query("select * from top_paths")) == 1
        raise RuntimeError
    assert len(cat.query("select * from top_paths")) == 3
    assert json.dumps(cat.con.execute("select getvariable('path_top_k')").fetchall()) == "[[null]]"
