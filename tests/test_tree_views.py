"""Tree views (ALGORITHM §2) on hand-made fact streams, against hand-computed expected rows."""

from __future__ import annotations

import pytest
from facts import catalog, edge, fanout, root, start, turn

from engine.config import RunConfig, TreeConfig


def rows(cat, view, key="edge_id"):
    return {r[key]: r for r in cat.query(f"select * from {view}")}


# ---------------------------------------------------------------- verdicts


def test_layer1_hard_fail_is_retried_and_the_retry_is_kept_whatever_happens():
    events = [root()]
    events += edge("T1/e1-1", "T1", None, None, slot=1, skip2=True)  # no score: retry
    events += edge("T1/e2-1", "T1", 1.5, 1.6, slot=2, calls=10, errors=4)  # 40% errors: retry
    events += edge("T1/e3-1", "T1", 1.2, 1.3, slot=3)  # clean: kept, first kept -> T1.1
    events += edge("T1/e1-2", "T1", None, 2.0, slot=1, attempt=2)  # eval failed: kept_exempt
    events += edge("T1/e2-2", "T1", 1.4, 1.5, slot=2, attempt=2)  # clean retry: kept
    e = rows(catalog(events), "edges")
    assert {k: (v["verdict"], v["child_id"]) for k, v in e.items()} == {
        "T1/e1-1": ("retry", None),
        "T1/e2-1": ("retry", None),
        "T1/e3-1": ("kept", "T1.1"),
        "T1/e1-2": ("kept_exempt", "T1.2"),
        "T1/e2-2": ("kept", "T1.3"),
    }
    assert e["T1/e1-1"]["skip_turn2"] is True
    assert e["T1/e2-1"]["tool_error_rate"] == 0.4 and e["T1/e2-1"]["eval_ok"] is True
    assert e["T1/e1-2"]["eval_ok"] is False and e["T1/e1-2"]["edge_score"] == 2.0


def test_layer2_is_exempt_and_turn2_is_not_skipped():
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6)]
    events += edge("T1.1/e1-1", "T1.1", None, None, calls=10, errors=5)
    cat = catalog(events)
    e = rows(cat, "edges")["T1.1/e1-1"]
    assert (e["layer"], e["skip_turn2"], e["verdict"], e["child_id"]) == (
        2,
        False,
        "kept_exempt",
        "T1.1.1",
    )
    node = rows(cat, "nodes", "node_id")["T1.1.1"]
    assert node["score"] is None and node["depth"] == 2
    # A skip is decided only for edges that can no longer be kept: here turn 2 is owed.
    pending = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6), start("T1.1/e1-1", "T1.1")]
    pending += turn("T1.1/e1-1", 1, None)
    e = rows(catalog(pending), "edges")["T1.1/e1-1"]
    assert (e["skip_turn2"], e["verdict"], e["completed_seq"]) == (False, None, None)


def test_a_turn_ended_by_a_backend_error_scores_nothing_unless_the_run_counts_such_turns():
    """A backend error is no rollout result, whatever evals its turn made before it (its server lost)."""
    lost = "error"
    events = [root(), start("T1/e1-1", "T1"), *turn("T1/e1-1", 1, 1.5, outcome=lost)]  # retried, turn 2 skipped
    events += [start("T1/e2-1", "T1"), *turn("T1/e2-1", 1, 1.5), *turn("T1/e2-1", 2, 1.6, outcome=lost)]
    events += edge("T1/e3-1", "T1", 1.2, 1.3)  # -> T1.1
    events += [start("T1.1/e1-1", "T1.1"), *turn("T1.1/e1-1", 1, 1.4), *turn("T1.1/e1-1", 2, 1.9, outcome=lost)]
    events += edge("T1.1/e2-1", "T1.1", 1.4, 1.5)  # -> T1.1.2
    events += [start("T1.1.2/e1-1", "T1.1.2"), *turn("T1.1.2/e1-1", 1, 2.0, outcome=lost)]  # pruned, turn 2 skipped
    e = rows(catalog(events), "edges")
    assert {k: (v["verdict"], v["skip_turn2"], v["edge_score"]) for k, v in e.items()} == {
        "T1/e1-1": ("retry", True, None),
        "T1/e2-1": ("retry", False, 1.5),
        "T1/e3-1": ("kept", False, 1.3),
        "T1.1/e1-1": ("kept_exempt", False, 1.4),  # (layer 2 is exempt: its turn 2 did not count)
        "T1.1/e2-1": ("kept", False, 1.5),
        "T1.1.2/e1-1": ("pruned", True, None),
    }
    # A run configured to count them, and one recorded before the key (read so), keeps their scores.
    counted = RunConfig(task="t", backend_error_scores="counted")
    before = RunConfig(task="t").model_dump(mode="json")
    del before["backend_error_scores"]
    for cat in (catalog(events, counted), catalog(events, before)):
        e = rows(cat, "edges")
        assert {k: (v["verdict"], v["edge_score"]) for k, v in e.items() if k != "T1/e3-1"} == {
            "T1/e1-1": (None, 1.5),  # (turn 2 owed)
            "T1/e2-1": ("kept", 1.6),
            "T1.1/e1-1": ("kept", 1.9),
            "T1.1/e2-1": ("kept", 1.5),
            "T1.1.2/e1-1": (None, 2.0),
        }


def layer3(*extra):
    """root -> T1.1 (1.5, 1.6) -> T1.1.1 (1.7, 1.8), then edges from T1.1.1 (layer 3)."""
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6), *edge("T1.1/e1-1", "T1.1", 1.7, 1.8)]
    for x in extra:
        events += x
    return events


def test_layer3_prunes_on_failed_eval_and_on_tool_errors_above_the_threshold():
    events = layer3(
        edge("T1.1.1/e1-1", "T1.1.1", None, None, skip2=True),  # no score
        edge("T1.1.1/e2-1", "T1.1.1", 1.9, 2.0, calls=10, errors=4),  # 40% errors
        edge("T1.1.1/e3-1", "T1.1.1", 1.9, 2.0, calls=10, errors=3),  # exactly 30%: kept
    )
    e = rows(catalog(events), "edges")
    assert e["T1.1.1/e1-1"]["verdict"] == "pruned" and e["T1.1.1/e1-1"]["skip_turn2"] is True
    assert e["T1.1.1/e2-1"]["verdict"] == "pruned"
    assert e["T1.1.1/e3-1"]["verdict"] == "kept"
    # Pruned attempts consume no ordinal: the kept one is the first child.
    assert e["T1.1.1/e3-1"]["child_id"] == "T1.1.1.1"
    n = rows(catalog(events), "nodes", "node_id")["T1.1.1"]
    assert (n["failed_expansions"], n["valid_children"]) == (2, 1)


# --------------------------------------------------------------- soft parts


def test_cleanliness_at_rates_0_01_03_031():
    from facts import start as st
    from facts import turn as tn

    events = layer3(
        edge("T1.1.1/e1-1", "T1.1.1", 1.9, 2.0, calls=10, errors=0),
        edge("T1.1.1/e2-1", "T1.1.1", 1.9, 2.0, calls=10, errors=1),
        edge("T1.1.1/e3-1", "T1.1.1", 1.9, 2.0, calls=10, errors=3),
        [
            st("T1.1.1/e4-1", "T1.1.1"),
            *tn("T1.1.1/e4-1", 1, 1.9, calls=50, errors=16),
            *tn("T1.1.1/e4-1", 2, 2.0, calls=50, errors=15),
        ],
    )
    e = rows(catalog(events), "edges")
    got = [round(e[f"T1.1.1/e{i}-1"]["tool_error_rate"], 6) for i in range(1, 5)]
    assert got == [0.0, 0.1, 0.3, 0.31]
    clean = [e[f"T1.1.1/e{i}-1"]["cleanliness"] for i in range(1, 5)]
    assert clean == pytest.approx([1.0, 0.8 - 0.5 * 0.1 / 0.3, 0.3, 0.3])
    assert e["T1.1.1/e4-1"]["verdict"] == "pruned"


def test_knowledge_four_cases_and_soft():
    # Parent T1.1 has score 1.6 (its last turn, 1.6, is where turn 1 starts).
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6)]
    events += edge("T1.1/e1-1", "T1.1", 1.7, 1.8, knowledge=True)  # improved, knowledge
    events += edge("T1.1/e2-1", "T1.1", 1.7, 1.65)  # improved, none; turn 2 regressed
    events += edge("T1.1/e3-1", "T1.1", 1.5, 1.55, knowledge=True)  # not improved, knowledge
    events += edge("T1.1/e4-1", "T1.1", 1.5, 1.6)  # 1.6 is not > 1.6: not improved
    e = rows(catalog(events), "edges")
    got = {
        k: (v["improved"], v["has_knowledge"], v["knowledge"], v["outcome"], v["regression_stability"])
        for k, v in e.items()
        if k.startswith("T1.1/")
    }
    assert got == {
        "T1.1/e1-1": (True, True, 1.0, 1.0, 1.0),
        "T1.1/e2-1": (True, False, 0.8, 1.0, 0.5),
        "T1.1/e3-1": (False, True, 0.6, 0.7, 0.5),
        "T1.1/e4-1": (False, False, 0.4, 0.7, 0.5),
    }
    soft = {k: e[k]["soft"] for k in got}
    assert soft == pytest.approx(
        {
            "T1.1/e1-1": 0.3 * 1.0 + 0.2 * 1.0 + 0.2 * 1.0 + 0.3 * 1.0,
            "T1.1/e2-1": 0.3 * 1.0 + 0.2 * 1.0 + 0.2 * 0.8 + 0.3 * 0.5,
            "T1.1/e3-1": 0.3 * 0.7 + 0.2 * 1.0 + 0.2 * 0.6 + 0.3 * 0.5,
            "T1.1/e4-1": 0.3 * 0.7 + 0.2 * 1.0 + 0.2 * 0.4 + 0.3 * 0.5,
        }
    )


def test_knowledge_needs_an_action_in_both_turns():
    events = [root(), start("T1/e1-1", "T1"), *turn("T1/e1-1", 1, 1.5, knowledge=True)]
    events += turn("T1/e1-1", 2, 1.6, knowledge=False)
    e = rows(catalog(events), "edges")["T1/e1-1"]
    assert e["has_knowledge"] is False and e["knowledge"] == 0.8


def test_null_edge_score_nulls_outcome_knowledge_and_soft():
    events = [root(), *edge("T1/e1-2", "T1", None, None, slot=1, attempt=2)]
    e = rows(catalog(events), "edges")["T1/e1-2"]
    assert (e["improved"], e["outcome"], e["knowledge"], e["soft"]) == (None, None, None, None)
    assert e["cleanliness"] == 1.0 and e["regression_stability"] == 0.0


def test_regression_with_null_scores_walks_up_to_the_last_numeric_turn():
    # T1.1 (1.5, 1.6) -> T1.1.1 kept exempt with no score at all -> edge from T1.1.1.
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6), *edge("T1.1/e1-1", "T1.1", None, None)]
    events += edge("T1.1.1/e1-1", "T1.1.1", 1.55, 1.7)
    events += edge("T1.1/e2-1", "T1.1", None, 1.7)  # layer 2: turn 1 null, turn 2 from 1.6
    e = rows(catalog(events), "edges")
    deep = e["T1.1.1/e1-1"]
    # ref(P) is the nearest numeric ancestor score (1.6); turn 1 starts from 1.6 too.
    assert (deep["improved"], deep["regression_stability"]) == (True, 0.5)
    assert e["T1.1/e2-1"]["regression_stability"] == 0.5
    assert e["T1.1/e2-1"]["edge_score"] == 1.7 and e["T1.1/e2-1"]["improved"] is True


def test_minimize_direction_orients_every_comparison():
    config = RunConfig(task="t", direction="minimize")
    events = [root(score=5.0), *edge("T1/e1-1", "T1", 4.0, 4.5)]
    cat = catalog(events, config)
    e = rows(cat, "edges")["T1/e1-1"]
    assert e["edge_score"] == 4.0 and e["improved"] is True
    assert e["regression_stability"] == 0.5  # 4.5 is worse than 4.0 when minimizing
    nodes = rows(cat, "nodes", "node_id")
    assert nodes["T1.1"]["score"] == 4.0 and nodes["T1.1"]["path_best"] == 4.0


# ------------------------------------------------------------- ranks and Q


def test_pct_with_ties_and_q_and_select_order():
    # Node scores 1.0 (root), 1.6, 1.3, 1.6: pct = 0, 5/6, 1/3, 5/6.
    events = [root()]
    events += fanout(scores=((1.5, 1.6), (1.2, 1.3), (1.4, 1.6)))
    cat = catalog(events)
    n = rows(cat, "nodes", "node_id")
    assert [n[k]["score_rank"] for k in ("T1", "T1.1", "T1.2", "T1.3")] == pytest.approx([0.0, 2.5 / 3, 1 / 3, 2.5 / 3])
    assert [n[k]["best_rank"] for k in ("T1", "T1.1", "T1.2", "T1.3")] == pytest.approx([0.0, 2.5 / 3, 1 / 3, 2.5 / 3])
    soft = 0.3 * 1.0 + 0.2 * 1.0 + 0.2 * 0.8 + 0.3 * 1.0  # improved, clean, no knowledge
    assert n["T1.1"]["process"] == pytest.approx(soft) and n["T1"]["process"] == 0.0
    q11 = 0.4 * 2.5 / 3 + 0.3 * 2.5 / 3 + 0.3 * soft
    assert n["T1.1"]["q"] == pytest.approx(q11)
    # All three are active with equal tok: T = 0.5 each; the tie goes to T1.1.
    assert n["T1.1"]["t"] == 0.5 and n["T1.1"]["select"] == pytest.approx(q11 + 0.25)
    work = cat.query("select * from int_next_work")[0]
    assert (work["kind"], work["parent_id"], work["edge_id"]) == ("select", "T1.1", "T1.1/e1-1")


def test_token_pct_prefers_short_contexts_with_mid_rank_ties():
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6, slot=1, tokens=20_000)]
    events += edge("T1/e2-1", "T1", 1.2, 1.3, slot=2, tokens=30_000)
    events += edge("T1/e3-1", "T1", 1.4, 1.6, slot=3, tokens=20_000)
    n = rows(catalog(events), "nodes", "node_id")
    assert [n[k]["t"] for k in ("T1.1", "T1.2", "T1.3")] == [0.75, 0.0, 0.75]


def test_single_node_pct_is_one_half():
    n = rows(catalog([root()]), "nodes", "node_id")["T1"]
    assert (n["score_rank"], n["best_rank"]) == (0.5, 0.5)


def test_select_tie_compares_ordinals_numerically():
    config = RunConfig(task="t", tree=TreeConfig(root_children=10))
    scores = [(1.2, 1.3)] * 10
    scores[1] = scores[9] = (1.5, 1.6)  # T1.2 and T1.10 tie for the best Select
    events = [root(), *fanout(scores=tuple(scores))]
    work = catalog(events, config).query("select * from int_next_work")[0]
    assert work["parent_id"] == "T1.2"


# ------------------------------------------------------- leaves and stops


def test_token_leaf_is_reported_before_depth():
    config = RunConfig(task="t", tree=TreeConfig(max_depth=1, root_children=2))
    events = [root(), *edge("T1/e1-1", "T1", 1.5, 1.6, slot=1, tokens=100_000)]
    events += edge("T1/e2-1", "T1", 1.5, 1.6, slot=2, tokens=99_999)
    n = rows(catalog(events, config), "nodes", "node_id")
    assert (n["T1.1"]["leaf_reason"], n["T1.2"]["leaf_reason"]) == ("token", "depth")


def exhausting(config):
    """root -> T1.1 -> T1.1.1, whose two layer-3 expansions are pruned."""
    return layer3(
        edge("T1.1.1/e1-1", "T1.1.1", None, None, skip2=True),
        edge("T1.1.1/e2-1", "T1.1.1", 1.9, 2.0, calls=10, errors=4),
    )


def test_exhausted_leaf_and_exhausted_stop():
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_children=1))
    cat = catalog(exhausting(config), config)
    n = rows(cat, "nodes", "node_id")
    assert n["T1.1.1"]["leaf_reason"] == "exhausted"
    assert n["T1.1"]["leaf_reason"] is None  # it has a child
    tree = cat.query("select * from int_trees__asof")[0]
    assert (tree["stop_reason"], tree["good_leaves"], tree["in_flight"]) == ("exhausted", 1, 0)
    assert cat.query("select * from int_next_work") == []
    # No stop is recorded in these facts: the condition holds, the stop is due.
    assert cat.query("select stop_reason, status from trees")[0] == {"stop_reason": None, "status": "done"}
    assert cat.query("select tree_id, stop_reason from int_trees__stopping") == [
        {"tree_id": "T1", "stop_reason": "exhausted"}
    ]


def test_good_leaves_stop_and_final_leaves_marked_stopped():
    config = RunConfig(task="t", tree=TreeConfig(target_good_leaves=2, max_depth=2))
    events = [root(), *fanout()]
    events += edge("T1.1/e1-1", "T1.1", 1.7, 1.8)  # depth 2: a depth leaf
    events += edge("T1.2/e1-1", "T1.2", 1.7, 1.8)  # second good leaf
    cat = catalog(events, config)
    tree = cat.query("select * from int_trees__asof")[0]
    assert tree["stop_reason"] == "good_leaves" and tree["is_done"] is True
    n = rows(cat, "nodes", "node_id")
    assert n["T1.1.1"]["leaf_reason"] == "depth" and n["T1.3"]["leaf_reason"] == "stopped"
    assert n["T1.1"]["leaf_reason"] is None


def test_max_edges_stop():
    config = RunConfig(task="t", tree=TreeConfig(max_valid_edges=2))
    cat = catalog([root(), *fanout()], config)
    tree = cat.query("select * from int_trees__asof")[0]
    assert (tree["kept_edges"], tree["stop_reason"]) == (3, "max_edges")


def test_an_edge_in_flight_blocks_its_parent_and_the_exhausted_stop():
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_children=1))
    events = layer3(edge("T1.1.1/e1-1", "T1.1.1", None, None, skip2=True))
    events.append(start("T1.1.1/e2-1", "T1.1.1", slot=2))
    cat = catalog(events, config)
    n = rows(cat, "nodes", "node_id")["T1.1.1"]
    assert (n["in_flight"], n["is_active"], n["leaf_reason"]) == (1, False, None)
    tree = cat.query("select * from int_trees__asof")[0]
    assert tree["stop_reason"] is None and tree["in_flight"] == 1
    assert rows(cat, "edges")["T1.1.1/e2-1"]["verdict"] is None


# ------------------------------------------------------------ next work


def test_next_work_fans_out_then_retries_then_selects():
    cat = catalog([root()])
    work = cat.query("select * from int_next_work order by pick")
    assert [(w["pick"], w["kind"], w["edge_id"]) for w in work] == [
        (1, "fanout", "T1/e1-1"),
        (2, "fanout", "T1/e2-1"),
        (3, "fanout", "T1/e3-1"),
    ]
    events = [root(), start("T1/e1-1", "T1", 1), start("T1/e2-1", "T1", 2)]
    assert catalog(events).query("select edge_id, pick from int_next_work") == [{"edge_id": "T1/e3-1", "pick": 1}]
    events = [root(), *edge("T1/e1-1", "T1", None, None, slot=1, skip2=True)]
    events += edge("T1/e2-1", "T1", 1.5, 1.6, slot=2) + edge("T1/e3-1", "T1", 1.5, 1.6, slot=3)
    work = catalog(events).query("select * from int_next_work order by pick")
    # Every start due, in order: the owed retry, then the Select winner (a retry
    # changes only the root's edges, so the winner stays the same).
    assert [(w["pick"], w["kind"]) for w in work] == [(1, "retry"), (2, "select")]
    assert work[0]["edge_id"] == "T1/e1-2" and work[1]["edge_id"] == "T1.1/e1-1"  # a tie: smaller id
    events += edge("T1/e1-2", "T1", 1.5, 1.6, slot=1, attempt=2)
    work = catalog(events).query("select * from int_next_work")[0]
    assert work["kind"] == "select"
    # A node's slot counts the edges it has started: after one pruned, the next is e2.
    events = layer3(edge("T1.1.1/e1-1", "T1.1.1", None, None, skip2=True))
    config = RunConfig(task="t", tree=TreeConfig(root_children=1, max_children=1))
    work = catalog(events, config).query("select * from int_next_work")[0]
    assert work["edge_id"] == "T1.1.1/e2-1"


def test_turns_view_lists_run_and_skipped_turns():
    events = [root(), *edge("T1/e1-1", "T1", None, None, slot=1, skip2=True, calls=3, errors=1)]
    got = catalog(events).query("select turn, skipped, tool_calls, tool_errors from turns order by turn")
    assert got == [
        {"turn": 1, "skipped": False, "tool_calls": 3, "tool_errors": 1},
        {"turn": 2, "skipped": True, "tool_calls": None, "tool_errors": None},
    ]
