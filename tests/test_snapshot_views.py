"""Snapshot selection views (ALGORITHM §1) against hand-computed expected values."""

from __future__ import annotations

import pytest
from conftest import catalog_of

from engine.config import RunConfig, SelectionConfig
from ingest.events import SnapshotSeen


def seen(i: int, score: float | None, eval_ok: bool | None = True, **kw) -> SnapshotSeen:
    name = f"eval-{i:06d}-agent-{i % 3 + 1}-{i:012x}"
    return SnapshotSeen(
        task="t",
        snapshot=name,
        path=f"/x/{name}",
        global_index=i,
        agent_id=f"agent-{i % 3 + 1}",
        eval_ok=eval_ok,
        score=score,
        **kw,
    )


def run_views(scores, direction="maximize", num_roots=30, eval_ok=None):
    eval_ok = eval_ok or {}
    events = [seen(i + 1, s, eval_ok.get(i, True)) for i, s in enumerate(scores)]
    config = RunConfig(task="t", direction=direction, selection=SelectionConfig(num_roots=num_roots))
    return catalog_of(events, config)


def stages(catalog):
    rows = catalog.query("select * from snapshots order by global_index")
    return [r["stage"] for r in rows], rows


# Plateaus make the centred 5-window means exact:
#   i:      0 1    2 3 4 5   6   7   8   9   10  11  12  13  14  15..18
#   smooth: 0 1.25 2 3 4 5.0 5.8 6.6 7.4 8.2 9.0 9.2 9.4 9.6 9.8 10
# S0 = smooth_0 = 0 (first ceil(0.05*19) = 1), S_inf = 10 (last ceil(0.2*19) = 4),
# so c = smooth/10: c_5 = 0.5 exactly (middle), c_10 = 0.9 exactly (late).
PLATEAUS = [0.0] * 3 + [5.0] * 5 + [9.0] * 5 + [10.0] * 6
PLATEAU_STAGES = ["early"] * 5 + ["middle"] * 5 + ["late"] * 9


def test_stages_with_ties_at_half_and_nine_tenths():
    got, rows = stages(run_views(PLATEAUS))
    assert got == PLATEAU_STAGES
    assert [r["smooth"] for r in rows][:6] == [0.0, 1.25, 2.0, 3.0, 4.0, 5.0]
    assert rows[5]["gain"] == 0.5
    assert rows[10]["gain"] == pytest.approx(0.9)
    assert rows[10]["smooth"] == 9.0


def test_minimize_direction_orients_scores():
    got, rows = stages(run_views([-s for s in PLATEAUS], direction="minimize"))
    assert got == PLATEAU_STAGES
    assert rows[18]["score"] == -10.0  # reported raw
    assert rows[18]["score_for_stage"] == 10.0  # oriented


def test_minimize_of_a_rising_curve_is_the_flat_fallback():
    got, rows = stages(run_views(PLATEAUS, direction="minimize"))
    # S_inf = -10 < S0 = 0: stages by position, N = 19: e = (19+5)//10 = 2, m = (19+1)//2 = 10.
    assert got == ["early"] * 2 + ["middle"] * 8 + ["late"] * 9
    assert all(r["gain"] is None for r in rows)


@pytest.mark.parametrize(
    ("n", "early", "middle"),
    [(10, 1, 4), (20, 2, 8), (1, 0, 1), (5, 1, 2), (14, 1, 6), (15, 2, 6)],
)
def test_flat_curve_falls_back_to_positions(n, early, middle):
    # e = floor(0.1N + 0.5), m = floor(0.5N + 0.5): N=5 -> 1, 3; N=14 -> 1, 7; N=15 -> 2, 8.
    got, _ = stages(run_views([3.0] * n))
    assert got == ["early"] * early + ["middle"] * middle + ["late"] * (n - early - middle)


def test_missing_scores_borrow_previous_then_following():
    scores = [None, None, 4.0, None, 6.0, None]
    _, rows = stages(run_views(scores, eval_ok={0: False, 1: False, 3: False, 5: False}))
    assert [r["score_for_stage"] for r in rows] == [4.0, 4.0, 4.0, 4.0, 6.0, 6.0]
    assert [r["is_eligible"] for r in rows] == [False, False, True, False, True, False]


@pytest.mark.parametrize(
    ("r", "quotas"),
    [
        (30, (5, 15, 10)),
        (1, (0, 1, 0)),
        (2, (0, 1, 1)),
        (6, (1, 3, 2)),
        (7, (1, 4, 2)),
        (9, (2, 5, 2)),
        (12, (2, 6, 4)),
        (100, (17, 50, 33)),
    ],
)
def test_quotas(r, quotas):
    catalog = run_views([1.0], num_roots=r)
    got = catalog.query("select stage, quota from int_snapshots__quotas order by stage_order")
    assert tuple(g["quota"] for g in got) == quotas


def picked(catalog):
    rows = catalog.query(
        "select global_index - 1 as i, selection_reason from snapshots where selected order by global_index"
    )
    return {r["i"]: r["selection_reason"] for r in rows}


def test_evenly_spaced_picks_use_integer_arithmetic():
    # Flat curve, N=100: early i<10, middle 10..49, late 50..99. Middle has 30
    # eligible (i = 10..39); R = 21 gives quotas 4/11/6. k=11 of n=30 picks
    # ((2j+1)*30)//22 = 1,4,6,9,12,15,17,20,23,25,28 (float n/k would give 14, not 15).
    eval_ok = {i: False for i in range(40, 100)} | {i: True for i in range(50, 56)}
    catalog = run_views([2.0] * 100, num_roots=21, eval_ok=eval_ok)
    got = picked(catalog)
    middle = sorted(i for i in got if 10 <= i < 50)
    assert middle == [10 + p for p in (1, 4, 6, 9, 12, 15, 17, 20, 23, 25, 28)]
    # early: 4 of 10 -> ((2j+1)*10)//8 = 1, 3, 6, 8; late: 6 of 6 eligible -> all.
    assert sorted(i for i in got if i < 10) == [1, 3, 6, 8]
    assert sorted(i for i in got if i >= 50) == [50, 51, 52, 53, 54, 55]
    assert set(got.values()) == {"quota"}


def test_starved_middle_is_filled_by_late_then_early():
    # Flat curve, N=100: early 0..9 (10 eligible), middle 10..49 (10 eligible: 10..19),
    # late 50..99 (12 eligible: 50..61). R=30: quotas 5/15/10.
    # Middle deficit 5; middle has nothing left, late has 2 unpicked, early takes 3.
    eval_ok = {i: False for i in range(20, 100)} | {i: True for i in range(50, 62)}
    catalog = run_views([2.0] * 100, eval_ok=eval_ok)
    got = picked(catalog)
    # early quota: ((2j+1)*10)//10 = 1,3,5,7,9; unpicked 0,2,4,6,8 -> fill ((2j+1)*5)//6 = 0,2,4.
    assert {i: r for i, r in got.items() if i < 10} == {
        1: "quota",
        3: "quota",
        5: "quota",
        7: "quota",
        9: "quota",
        0: "fill",
        4: "fill",
        8: "fill",
    }
    assert {i for i in got if 10 <= i < 50} == set(range(10, 20))
    # late quota 10 of 12: ((2j+1)*12)//20 = 0,1,3,4,5,6,7,9,10,11; fills: positions 2, 8.
    late = {i - 50: r for i, r in got.items() if i >= 50}
    assert [p for p, r in sorted(late.items()) if r == "fill"] == [2, 8]
    assert len(got) == 30
    summary = catalog.query("select * from snapshot_stages order by stage_order")
    assert [(s["stage"], s["picked_quota"], s["fills"]) for s in summary] == [
        ("early", 5, 3),
        ("middle", 10, 0),
        ("late", 10, 2),
    ]


def test_starved_early_is_filled_by_middle_before_late():
    # N=100 flat: early eligible 2 (deficit 3); middle all 40 eligible (25 unpicked);
    # late all 50 eligible. D = 3 goes entirely to middle.
    eval_ok = {i: i < 2 for i in range(10)}
    catalog = run_views([2.0] * 100, eval_ok=eval_ok)
    summary = catalog.query("select stage, fills, picked from snapshot_stages order by stage_order")
    assert [(s["stage"], s["fills"], s["picked"]) for s in summary] == [
        ("early", 0, 2),
        ("middle", 3, 18),
        ("late", 0, 10),
    ]


def test_fewer_eligible_than_roots_takes_all():
    eval_ok = {i: i % 4 == 0 for i in range(40)}
    catalog = run_views([float(i) for i in range(40)], eval_ok=eval_ok)
    got = picked(catalog)
    assert sorted(got) == [i for i in range(40) if i % 4 == 0]


def test_failed_snapshot_with_score_shapes_stages_but_is_never_picked():
    eval_ok = {i: i != 18 for i in range(19)}
    catalog = run_views(PLATEAUS, eval_ok=eval_ok, num_roots=19)
    got, rows = stages(catalog)
    assert got == PLATEAU_STAGES
    assert rows[18]["score_for_stage"] == 10.0
    assert 18 not in picked(catalog)


def test_skipped_folders_are_listed_without_stage():
    events = [
        seen(1, 1.0),
        seen(2, 2.0),
        SnapshotSeen(task="t", snapshot="junk", path="/x/junk", skip_reason="unparseable folder name"),
    ]
    catalog = catalog_of(events, RunConfig(task="t"))
    rows = {r["snapshot"]: r for r in catalog.query("select * from snapshots")}
    assert rows["junk"]["stage"] is None and rows["junk"]["selected"] is False
    assert rows["junk"]["skip_reason"] == "unparseable folder name"
