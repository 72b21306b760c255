"""Preference pairs, unpaired labels and step labels (ALGORITHM §3): the views against an independent
count from their definitions, the recorded decision, replay, reselect --rule and the exports."""

from __future__ import annotations

import filecmp
import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import copied_runs, copy_run
from facts import catalog, edge, root
from test_replay import first, forge

from cli import cli
from engine.replay import at_decisions
from engine.supervision import Rule, supervision_decision


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


@pytest.fixture(scope="module")
def runs(runs, tmp_path_factory) -> Path:
    """The shared runs, copied: this module forges runs beside them (forged-pairs, unrecorded, ...)."""
    return copied_runs(runs, tmp_path_factory, "supervised")


def hand_tree():
    """One tree with every case a pair or a label meets.

    - the root: three directions, the second retried (40% tool errors), its retry kept;
    - T1.1: three attempts (two improve on T1.1's 1.6, one does not);
    - T1.1.1 (layer 3): a pruned attempt (no score, turn 2 skipped) and a pruned one that improved (40% tool
      errors) beside a kept one that did not: a pair against the tree's verdicts;
    - T1.2: one attempt only (no pair).
    """
    events = [root(score=1.0)]
    events += edge("T1/e1-1", "T1", 1.5, 1.6, slot=1)  # kept -> T1.1
    events += edge("T1/e2-1", "T1", 1.5, 1.6, slot=2, calls=10, errors=4)  # 40% errors: retry
    events += edge("T1/e3-1", "T1", 1.2, 0.9, slot=3)  # kept -> T1.2 (regressed)
    events += edge("T1/e2-2", "T1", 1.1, 1.2, slot=2, attempt=2, knowledge=True)  # retry: kept -> T1.3
    events += edge("T1.1/e1-1", "T1.1", 1.7, 1.8, knowledge=True)  # improves: kept -> T1.1.1
    events += edge("T1.1/e2-1", "T1.1", 1.5, 1.4)  # does not: kept -> T1.1.2
    events += edge("T1.1/e3-1", "T1.1", 1.7, 1.9, calls=10, errors=1)  # improves, one error -> T1.1.3
    events += edge("T1.1.1/e1-1", "T1.1.1", None, None, skip2=True)  # layer 3, no score: pruned
    events += edge("T1.1.1/e2-1", "T1.1.1", 1.7, 1.75)  # kept -> T1.1.1.1 (does not improve on 1.8)
    events += edge("T1.1.1/e3-1", "T1.1.1", 2.5, 2.6, calls=10, errors=4)  # improves, 40% errors: pruned
    events += edge("T1.2/e1-1", "T1.2", 1.0, 1.3)  # T1.2's only attempt -> T1.2.1
    return events


def reference(edges: list[dict], rule: str, min_margin: float, threshold: float, against_verdict: str = "keep"):
    """The definitions of ALGORITHM §3 in plain Python over the edges view: values, labels, pairs, steps, N_eff.

    A pair goes against the tree's verdicts when its chosen attempt failed the prune test (a hard
    failure: no score in a turn, or tool errors above 30%) and its rejected one passed it."""
    done = [e for e in edges if e["verdict"] is not None]
    value = {
        e["edge_id"]: round((e["soft"] or 0.0) if rule == "soft" else (1.0 if e["improved"] else 0.0), 12) for e in done
    }
    labels = {e: v >= round(threshold, 12) for e, v in value.items()}
    pairs = set()
    for a, b in itertools.permutations(done, 2):
        gap = round(value[a["edge_id"]] - value[b["edge_id"]], 12)
        against = hard_fail(a) and not hard_fail(b)
        if against and against_verdict == "drop":
            continue
        if a["parent_id"] == b["parent_id"] and gap > 0 and gap >= round(min_margin, 12):
            pairs.add((a["parent_id"], a["edge_id"], b["edge_id"]))
    kept = {e["child_id"]: e for e in done if e["child_id"]}
    parents = {e["parent_id"] for e in kept.values()}
    steps = {}
    for leaf in set(kept) - parents:
        chain, node = [], leaf
        while node in kept:
            chain.insert(0, kept[node]["edge_id"])
            node = kept[node]["parent_id"]
        steps[leaf] = (chain, [labels[e] for e in chain])
    involved: dict[str, set[str]] = {}
    for node, a, b in pairs:
        involved.setdefault(node, set()).update((a, b))
    n_eff = sum(len(v) - 1 for v in involved.values())
    return value, labels, pairs, steps, n_eff


def hard_fail(edge: dict) -> bool:
    return edge["s1"] is None or edge["s2"] is None or edge["tool_errors"] > 0.3 * edge["tool_calls"]


@pytest.mark.parametrize(
    ("rule", "min_margin", "threshold", "against_verdict"),
    [
        ("soft", 0.1, 0.7, "keep"),
        ("soft", 0.1, 0.7, "drop"),
        ("soft", 0.3, 0.9, "keep"),
        ("improved", 1.0, 1.0, "keep"),
        ("improved", 1.0, 1.0, "drop"),
        ("improved", 0.5, 0.5, "drop"),
    ],
)
def test_the_views_equal_an_independent_count_from_their_definitions(rule, min_margin, threshold, against_verdict):
    cat = catalog(hand_tree())
    edges = cat.query("select * from edges")
    assert {e["verdict"] for e in edges} == {"kept", "retry", "pruned"}
    value, labels, pairs, steps, n_eff = reference(edges, rule, min_margin, threshold, against_verdict)
    with cat.variables.using(**Rule(rule, min_margin, threshold, against_verdict).variables()):
        got_labels = {r["edge_id"]: (r["value"], r["label"]) for r in cat.query("select * from labels")}
        got_pairs = {(r["node_id"], r["chosen_id"], r["rejected_id"]) for r in cat.query("select * from pairs")}
        got_steps = {r["leaf_id"]: (r["edge_ids"], r["step_labels"]) for r in cat.query("select * from steps")}
        margins = {(r["chosen_id"], r["rejected_id"]): r["margin"] for r in cat.query("select * from pairs")}
        decision = supervision_decision(cat, cat.tail_seq(), Rule(rule, min_margin, threshold, against_verdict))
    assert got_labels == {e: (value[e], labels[e]) for e in value}
    assert got_pairs == pairs and pairs
    assert got_steps == steps
    assert all(abs(m - (value[a] - value[b])) < 1e-9 for (a, b), m in margins.items())
    # Every finished attempt is labelled: the retry, the pruned one and the one without a score.
    assert set(got_labels) == {e["edge_id"] for e in edges}
    # The node with three attempts pairs at most three ways; the node of one attempt never.
    assert {n for n, _, _ in pairs} <= {"T1", "T1.1", "T1.1.1"}
    # Recorded, the counts follow from the recorded lists: N_eff = attempts involved - 1 per fork point.
    recorded = catalog([*hand_tree(), decision])
    (counts,) = recorded.query("select * from supervision_counts")
    assert (counts["pairs"], counts["fork_points"], counts["pair_n_eff"]) == (
        len(pairs),
        len({n for n, _, _ in pairs}),
        n_eff,
    )
    assert counts["pair_n_eff_ratio"] == pytest.approx(n_eff / len(pairs))
    assert (counts["good"], counts["bad"]) == (sum(labels.values()), len(labels) - sum(labels.values()))
    assert counts["step_paths"] == len(steps)
    failed = {e["edge_id"] for e in edges if hard_fail(e)}
    against = {(n, a, b) for n, a, b in pairs if a in failed and b not in failed}
    assert counts["against_verdict"] == len(against)
    if against_verdict == "drop":
        assert against == set()
    elif min_margin < 0.18:  # the pruned attempt of T1.1.1 that improved, over its kept sibling that did not
        assert against == {("T1.1.1", "T1.1.1/e3-1", "T1.1.1/e2-1")}
    assert at_decisions(recorded).query("select * from audit_supervision_selected") == []


def test_a_difference_equal_to_the_margin_pairs_and_equal_values_never_do():
    cat = catalog(hand_tree())
    soft = {r["edge_id"]: r["soft"] for r in cat.query("select edge_id, soft from edges")}
    gap = round(soft["T1.1/e1-1"] - soft["T1.1/e2-1"], 12)
    assert gap > 0
    for margin, paired in ((gap, True), (gap + 1e-6, False)):
        with cat.variables.using(**Rule("soft", margin, 0.7).variables()):
            got = {(r["chosen_id"], r["rejected_id"]) for r in cat.query("select * from pairs")}
        assert (("T1.1/e1-1", "T1.1/e2-1") in got) is paired, (margin, got)
    # Under "improved" the two attempts of T1.1 that improved tie (1 = 1): they never pair.
    with cat.variables.using(**Rule("improved", 1.0, 1.0).variables()):
        got = {(r["chosen_id"], r["rejected_id"]) for r in cat.query("select * from pairs where node_id = 'T1.1'")}
    assert got == {("T1.1/e1-1", "T1.1/e2-1"), ("T1.1/e3-1", "T1.1/e2-1")}


def test_a_recorded_decision_that_the_prefix_does_not_imply_is_named():
    decision = supervision_decision(catalog(hand_tree()), 10_000, Rule("soft", 0.1, 0.7))
    labels = [dict(x) for x in decision.labels]
    labels[0]["label"] = not labels[0]["label"]
    pairs = decision.pairs[1:]  # one pair left out
    forged = decision.model_copy(update={"labels": labels, "pairs": pairs})
    found = at_decisions(catalog([*hand_tree(), forged])).query("select * from audit_supervision_selected")
    assert {(r["subject"], r["problem"]) for r in found} == {
        (labels[0]["edge_id"], "differs"),
        (f"{decision.pairs[0]['chosen_id']} > {decision.pairs[0]['rejected_id']}", "not recorded"),
    }


# ------------------------------------------------------------- on a sim run


@pytest.mark.slow
def test_reselect_records_a_rule_once_and_replay_re_derives_every_one(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data, "sup")
    first_time = invoke(
        data, "reselect", "sup", "--rule", "improved", "--min-margin", "1", "--threshold", "1", "--json"
    )
    assert first_time.exit_code == 0, first_time.output
    out = json.loads(first_time.stdout)
    assert out["appended"] is True and out["rule"] == "improved" and out["counts"]
    again = json.loads(
        invoke(data, "reselect", "sup", "--rule", "improved", "--min-margin", "1", "--threshold", "1", "--json").stdout
    )
    assert again["appended"] is False and again["selection_id"] == out["selection_id"]
    replayed = json.loads(invoke(data, "replay", "sup", "--json").stdout)
    assert replayed["differ"] == 0
    kinds = [
        r["selection_id"]
        for r in json.loads(
            invoke(data, "sql", "select selection_id from stg_supervision_selected order by seq", "--json").stdout
        )
    ]
    assert len(kinds) == 2 and kinds[1] == out["selection_id"]  # explore's default, then the reselection


def test_a_forged_supervision_selection_is_found_by_replay(runs):
    def change(rows):
        sel = first(rows, "supervision_selected")
        pairs = json.loads(sel["pairs"])
        pairs[0]["margin"] += 0.5
        sel["pairs"] = json.dumps(pairs)

    forge(runs, "rounds", "forged-pairs", change)
    r = invoke(runs, "replay", "forged-pairs", "--json")
    assert r.exit_code == 1
    found = json.loads(r.stdout)["differences"]
    assert {(d["kind"], d["problem"]) for d in found} == {("supervision_selected", "differs")}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dpo", "kto", "steps"])
def test_each_export_is_the_recorded_selection_and_byte_identical_run_to_run(runs, tmp_path, fmt):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        r = invoke(runs, "export", "rounds", "--format", fmt, "--out", str(out))
        assert r.exit_code == 0, r.output
    assert filecmp.cmp(a / f"rounds.{fmt}.jsonl", b / f"rounds.{fmt}.jsonl", shallow=False)
    assert filecmp.cmp(a / "manifest.json", b / "manifest.json", shallow=False)
    rows = [json.loads(line) for line in (a / f"rounds.{fmt}.jsonl").read_text().splitlines()]
    manifest = json.loads((a / "manifest.json").read_text())
    (run,) = manifest["runs"]
    recorded = json.loads(
        invoke(
            runs,
            "sql",
            "select pairs, labels, step_paths from stg_supervision_selected where run_id = 'rounds'",
            "--json",
        ).stdout
    )[0]
    listed = json.loads(recorded[{"dpo": "pairs", "kto": "labels", "steps": "step_paths"}[fmt]])
    assert len(rows) == run["samples"] == len(listed) > 0
    counts = {(c["task"], c["stage"]): c for c in run["supervision"]}
    if fmt == "dpo":
        assert [(r["metadata"]["chosen"]["edge_id"], r["metadata"]["rejected"]["edge_id"]) for r in rows] == [
            (p["chosen_id"], p["rejected_id"]) for p in listed
        ]
        assert sum(c["pairs"] for c in counts.values()) == len(rows)
        for row in rows:
            # The two attempts received one turn prompt: it ends the prompt, both sides start with an answer.
            assert row["chosen"][0]["role"] == row["rejected"][0]["role"] == "assistant"
            assert row["prompt"][-1]["role"] == "user" and row["metadata"]["shared_prompt"] is True
            assert row["chosen"] != row["rejected"] and row["metadata"]["margin"] >= 0.1 - 1e-12
            assert row["prompt"][0]["role"] == "system"
            # (the run's rule drops pairs that go against the tree's verdicts)
            assert row["metadata"]["against_verdict"] is False
        assert run["against_verdict"] == "drop" and run["against_verdict_pairs"] == 0
    if fmt == "kto":
        assert {r["label"] for r in rows} == {True, False}
        assert sum(c["good"] for c in counts.values()) == sum(r["label"] for r in rows)
    if fmt == "steps":
        assert all(len(r["completions"]) == len(r["labels"]) == len(r["metadata"]["edges"]) for r in rows)
        paths = json.loads(
            invoke(runs, "sql", "select count(*) as n from paths where run_id = 'rounds'", "--json").stdout
        )[0]["n"]
        assert len(rows) == paths  # every final leaf's path


@pytest.mark.slow
def test_a_pair_is_the_two_attempts_conversations_cut_at_their_fork(runs, tmp_path):
    """prompt + chosen is the chosen attempt's whole conversation, as the SFT export renders a path to it."""
    from engine.export.paths import path_sample
    from engine.runset import Reader

    out = tmp_path / "pairs"
    assert invoke(runs, "export", "rounds", "--format", "dpo", "--out", str(out)).exit_code == 0
    rows = [json.loads(line) for line in (out / "rounds.dpo.jsonl").read_text().splitlines()]
    paths = json.loads(
        invoke(runs, "sql", "select tree_id, leaf_id, node_ids from top_paths where run_id = 'rounds'", "--json").stdout
    )
    edges = json.loads(
        invoke(
            runs,
            "sql",
            "select edge_id, child_id from edges where child_id is not null and run_id = 'rounds'",
            "--json",
        ).stdout
    )
    made = {e["edge_id"]: e["child_id"] for e in edges}
    checked = 0
    for row in rows:
        child = made.get(row["metadata"]["chosen"]["edge_id"])
        path = next((p for p in paths if p["leaf_id"] == child), None)
        if path is None:
            continue  # the chosen attempt's node is no leaf of a selected path
        sample, _ = path_sample(Reader(runs), "rounds", path["tree_id"], child)
        assert [*row["prompt"], *row["chosen"]] == sample["messages"]
        assert row["tools"] == sample["tools"]
        checked += 1
    assert checked > 0


def without_supervision(rows):
    """The log as a run recorded before supervision selections has it (the seqs after renumbered)."""
    rows[:] = [r for r in rows if r["kind"] != "supervision_selected"]
    for seq, row in enumerate(rows, start=1):
        row["seq"] = seq


@pytest.mark.slow
def test_bad_rules_margins_and_runs_without_a_selection_are_clear_errors(runs, tmp_path):
    data = tmp_path / "data"
    copy_run(runs, "rounds", data, "r")
    bad = invoke(data, "reselect", "r", "--rule", "louder")
    assert bad.exit_code == 2 and "louder" in bad.output
    zero = invoke(data, "reselect", "r", "--rule", "soft", "--min-margin", "0")
    assert zero.exit_code == 2 and "--min-margin" in zero.output and "above 0" in zero.output
    alone = invoke(data, "reselect", "r", "--threshold", "0.5")
    assert alone.exit_code == 2 and "go with --rule" in alone.output
    mixed = invoke(data, "reselect", "r", "--rule", "soft", "--top-k", "2")
    assert mixed.exit_code == 2
    unknown = invoke(
        data, "export", "r", "--format", "dpo", "--selection", "supervision-000000000000", "--out", str(tmp_path / "x")
    )
    assert unknown.exit_code == 1 and "has no supervision selection 'supervision-000000000000'" in unknown.stderr
    assert not (tmp_path / "x").exists()

    forge(
        runs,
        "rounds",
        "old",
        without_supervision,
    )
    none = invoke(runs, "export", "old", "--format", "kto", "--out", str(tmp_path / "y"))
    assert none.exit_code == 1 and "reselect old --rule soft" in none.stderr
    assert not (tmp_path / "y").exists()


@pytest.mark.slow
def test_a_run_without_a_node_of_two_attempts_exports_no_pair_and_says_why(tmp_path):
    """Only kept directions, one attempt each below: under 'improved', no two attempts of one node differ."""
    import hand_run

    data = tmp_path / "data"
    hand_run.write(data)
    chosen = invoke(data, "reselect", "hand", "--rule", "improved", "--min-margin", "1", "--threshold", "1", "--json")
    assert chosen.exit_code == 0, chosen.output
    pairs = json.loads(invoke(data, "sql", "select count(*) as n from pairs", "--json").stdout)[0]["n"]
    sid = json.loads(chosen.stdout)["selection_id"]
    r = invoke(data, "export", "hand", "--format", "dpo", "--selection", sid, "--out", str(tmp_path / "p"))
    assert pairs == 0
    assert r.exit_code == 1 and "no preference pair in hand" in r.stderr and "rule improved" in r.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_a_killed_attempt_is_labelled_with_its_conversation_as_the_sft_export_renders_it(tmp_path):
    """The hand run's two attempts from T1.1 were killed in the middle of a bash call (one in turn 1,
    one in turn 2): each kto row is the SFT sample of the path to the attempt's node, cut at its fork."""
    import hand_run

    from engine.export.paths import path_sample
    from engine.runset import Reader

    data = tmp_path / "data"
    hand_run.write(data)
    assert invoke(data, "reselect", "hand", "--rule", "soft").exit_code == 0
    out = tmp_path / "labels"
    r = invoke(data, "export", "hand", "--format", "kto", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = {json.loads(x)["metadata"]["attempt"]["edge_id"]: json.loads(x) for x in (out / "hand.kto.jsonl").open()}
    assert set(rows) == {"T1/e1-1", "T1.1/e1-1", "T1.1/e2-1"}
    for edge_id, leaf in (("T1.1/e1-1", "T1.1.1"), ("T1.1/e2-1", "T1.1.2")):
        sample, _ = path_sample(Reader(data), "hand", "T1", leaf)
        row = rows[edge_id]
        assert [*row["prompt"], *row["completion"]] == sample["messages"]
        assert row["metadata"]["interrupted_calls"] == sample["metadata"]["interrupted_calls"] != []
        # The row's prompt runs to the model's first answer: its turn prompt, which names its edge (the hand
        # run's prompts are as logs recorded before sibling prompts were the same): it says so.
        assert row["prompt"][-1]["role"] == "user" and row["completion"][0]["role"] == "assistant"
        assert edge_id in row["prompt"][-1]["content"] and row["metadata"]["shared_prompt"] is False
    assert rows["T1/e1-1"]["metadata"]["shared_prompt"] is True  # the only attempt from T1


@pytest.mark.slow
def test_an_attempt_without_a_recorded_conversation_is_left_out_and_counted(runs, tmp_path):
    """A pair one of whose attempts recorded no conversation cannot be rendered: left out, counted, named."""
    victim = {}

    def change(rows):
        pair = json.loads(first(rows, "supervision_selected")["pairs"])[0]
        victim["edge"] = pair["rejected_id"]
        recorded = first(rows, "conversation_recorded", edge_id=pair["rejected_id"], turn=1)
        recorded["edge_id"] = "nowhere"  # the attempt's turn 1 recorded nothing (seqs unchanged)

    forge(runs, "rounds", "unrecorded", change)
    out = tmp_path / "pairs"
    r = invoke(runs, "export", "unrecorded", "--format", "dpo", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.stdout)["runs"]
    pairs = json.loads(
        invoke(runs, "sql", "select pairs from stg_supervision_selected where run_id = 'unrecorded'", "--json").stdout
    )[0]["pairs"]
    involved = [p for p in json.loads(pairs) if victim["edge"] in (p["chosen_id"], p["rejected_id"])]
    assert run["left_out"]["unrecorded"] == len(involved) > 0
    assert run["samples"] == len(json.loads(pairs)) - len(involved)
    text = invoke(runs, "export", "unrecorded", "--format", "dpo", "--out", str(tmp_path / "again"))
    assert f"left out {len(involved)} unrecorded" in text.output


@pytest.mark.slow
def test_a_log_whose_turn_prompts_name_their_attempt_exports_rows_that_say_so(runs, tmp_path):
    """A log recorded when each turn's prompt named its edge (before the attempts from one node shared one):
    a pair's prompt ends before the two turn prompts, each side starts with its own, and the rows say that
    sibling prompts differ; the same run with shared prompts gives the prompt to the model's first answer."""
    marker = re.compile(r"\n\[edge \S+ turn \d\]$")

    def change(rows):
        for row in rows:
            if row["kind"] == "conversation_recorded":
                messages = json.loads(row["messages"])
                for m in messages:
                    if m["role"] == "user":
                        m["content"] += f"\n[edge {row['edge_id']} turn {row['turn']}]"
                row["messages"] = json.dumps(messages)

    def unmarked(messages):
        return [m | {"content": marker.sub("", m["content"])} if m["role"] == "user" else m for m in messages]

    forge(runs, "rounds", "named-prompts", change)
    exported = {}
    for run in ("rounds", "named-prompts"):
        for fmt in ("dpo", "kto"):
            out = tmp_path / f"{run}-{fmt}"
            assert invoke(runs, "export", run, "--format", fmt, "--out", str(out)).exit_code == 0
            exported[(run, fmt)] = [json.loads(x) for x in (out / f"{run}.{fmt}.jsonl").open()]
    named, shared = exported[("named-prompts", "dpo")], exported[("rounds", "dpo")]
    assert len(named) == len(shared) > 0
    for old, new in zip(named, shared, strict=True):
        assert old["metadata"]["shared_prompt"] is False and new["metadata"]["shared_prompt"] is True
        for side in ("chosen", "rejected"):
            edge_id = old["metadata"][side]["edge_id"]
            assert old[side][0]["role"] == "user" and old[side][0]["content"].endswith(f"[edge {edge_id} turn 1]")
            assert unmarked(old[side][1:]) == new[side]
        assert unmarked([*old["prompt"], old["chosen"][0]]) == new["prompt"]
    # Unpaired: every row's prompt runs to its model's first answer; it says whether its node's attempts
    # shared their turn prompt (an attempt alone at its node always does).
    named, shared = exported[("named-prompts", "kto")], exported[("rounds", "kto")]
    siblings = Counter(row["metadata"]["node_id"] for row in shared)
    for old, new in zip(named, shared, strict=True):
        assert old["completion"][0]["role"] == new["completion"][0]["role"] == "assistant"
        assert unmarked(old["prompt"]) == new["prompt"] and unmarked(old["completion"]) == new["completion"]
        assert new["metadata"]["shared_prompt"] is True
        assert old["metadata"]["shared_prompt"] is (siblings[new["metadata"]["node_id"]] == 1)
