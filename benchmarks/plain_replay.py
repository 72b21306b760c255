"""THE BASELINE of benchmarks/collection.py: a replay in plain Python, as a user without DuckDB would write it.

Not part of teacher-mcts (whose one definition of every rule is ``views/*.sql``): an
independent, straightforward reimplementation of docs/ALGORITHM.md used only to
measure what the views save. It reads a run's light columns with pyarrow, turns each
kind's rows into dicts (``to_pylist``) and rebuilds every tree with dicts and loops,
then re-derives every recorded decision at its watermark: each edge verdict and
child id, each turn-2 skip, each node selection (Q, T and Select of every node
there), each tree stop, each path selection (the PathScore and Top-k of every
tree there), each supervision selection (the pairs, labels and step paths under its
rule at its watermark), the snapshot pick, and the coverage checks replay makes (N_eff <= N
per stratum, quota picks within quotas). Written to be correct and reasonable -
sorted lists and bisection for the rank populations, one pass over each kind - not
to be slow. It returns the counts the real replay reports, so the benchmark checks
that both did the same work, and the differences it found (none on a healthy log).

Diversity reselections (``reselect --diversity``) are not covered: the benchmark's
logs hold none, and a run holding one is refused.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from ingest.events import DECISION_KINDS
from ingest.log import EventLog

COLUMNS = {
    "run_started": ["seq", "direction", "config"],
    "run_finished": ["seq"],
    "snapshot_seen": ["seq", "task", "snapshot", "global_index", "eval_ok", "score", "skip_reason"],
    "snapshots_picked": ["seq", "watermark", "task", "detail"],
    "root_added": ["seq", "tree_id", "task", "stage", "agent_id", "score"],
    "edge_started": ["seq", "tree_id", "edge_id", "parent_id", "slot", "attempt"],
    "tool_called": ["tree_id", "edge_id", "turn", "tool", "status", "target"],
    "step_finished": ["tree_id", "edge_id", "turn"],
    "conversation_recorded": ["tree_id", "edge_id", "turn", "model_calls"],
    "eval_finished": ["tree_id", "edge_id", "turn", "score"],
    "turn_finished": ["seq", "tree_id", "edge_id", "turn", "context_tokens", "state"],
    "edge_judged": ["seq", "watermark", "tree_id", "edge_id", "verdict", "child_id"],
    "turn_skipped": ["seq", "watermark", "tree_id", "edge_id"],
    "node_selected": ["seq", "watermark", "tree_id", "node_id", "select_score", "q", "t"],
    "tree_stopped": ["seq", "watermark", "tree_id", "reason"],
    "paths_selected": ["seq", "watermark", "weights", "top_k", "paths"],
    "supervision_selected": [
        *("seq", "watermark", "rule", "min_margin", "threshold", "against_verdict", "pairs", "labels", "step_paths")
    ],
}
EDGE_ID = re.compile(r"^(.+)/e(\d+)-(\d+)$")
INF_SEQ = 2**63


def read_run(data: Path, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Each kind's events of a run as dicts (only the columns the replay uses), in seq order."""
    wanted = sorted({"kind", *(c for cols in COLUMNS.values() for c in cols)})
    table = EventLog(data, run_id).read_table(wanted)
    events = {}
    for kind, cols in COLUMNS.items():
        events[kind] = table.filter(pc.equal(table.column("kind"), kind)).select(cols).to_pylist()
    kinds = table.column("kind")
    events["log"] = [
        {
            "tail": pc.max(table.column("seq")).as_py(),
            "decisions": sum(pc.sum(pc.equal(kinds, k)).as_py() or 0 for k in DECISION_KINDS),
        }
    ]
    return events


# ------------------------------------------------------------ small rules


def pct(less: int, equal: int, total: int) -> float:
    return 0.5 if total <= 1 else (less + 0.5 * (equal - 1)) / (total - 1)


def differs(a: float | None, b: float | None) -> bool:
    """Two recorded numbers differ (beyond 1e-9; a missing one differs from a present one)."""
    if a is None or b is None:
        return (a is None) != (b is None)
    return a != b and not (math.isnan(a) and math.isnan(b)) and abs(a - b) > 1e-9


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def node_key(node_id: str) -> list[int]:
    return [int(x) for x in node_id.split(".")[1:]]


def counts_in(sorted_values: list[float], x: float) -> tuple[int, int]:
    """How many values are below x, and how many equal it."""
    lo = bisect.bisect_left(sorted_values, x)
    return lo, bisect.bisect_right(sorted_values, x) - lo


# ------------------------------------------------------------ the run's model


@dataclass
class Edge:
    tree_id: str
    edge_id: str
    parent_id: str
    slot: int
    attempt: int
    layer: int
    started_seq: int | None = None
    s1: float | None = None
    s2: float | None = None
    turn1_seq: int | None = None
    turn2_seq: int | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    knowledge_turns: int = 0
    tok: int | None = None
    skip_turn2: bool = False
    completed_seq: int | None = None
    verdict: str | None = None
    child_id: str | None = None
    edge_score_o: float | None = None
    improved: bool | None = None
    cleanliness: float | None = None
    knowledge: float | None = None
    soft: float | None = None


@dataclass
class Node:
    tree_id: str
    node_id: str
    parent_id: str | None
    depth: int
    score_o: float | None
    tok: int
    created_seq: int
    edge: Edge | None
    last_turn_score_o: float | None
    ref_o: float | None = None
    start_o: float | None = None
    path_best_o: float | None = None
    process: float = 0.0


@dataclass
class Tree:
    tree_id: str
    task: str | None
    stage: str | None
    agent_id: str | None
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: dict[str, Edge] = field(default_factory=dict)  # started edges
    points: set[int] = field(default_factory=set)


class Config:
    """The recorded run config's values the rules use."""

    def __init__(self, started: dict[str, Any]) -> None:
        c = json.loads(started["config"])
        self.sign = -1.0 if started["direction"] == "minimize" else 1.0
        self.tree, self.soft, self.q, self.paths, self.knowledge = (
            c[k] for k in ("tree", "soft", "q", "paths", "knowledge")
        )
        self.num_roots = c["selection"]["num_roots"]
        self.path_re = re.compile(self.knowledge["path_regex"])
        self.command_re = re.compile(self.knowledge["command_regex"])

    def oriented(self, score: float | None) -> float | None:
        return None if score is None else score * self.sign

    def is_knowledge(self, tool: str, target: str | None) -> bool:
        """A file tool touching a shared path, a shell command touching one or running coral, the skill tool."""
        k = self.knowledge
        if tool in k["knowledge_tools"]:
            return True
        shell = tool in k["shell_tools"]
        if target is None or not (shell or tool in k["file_tools"]):
            return False
        if self.path_re.search(target):
            return True
        return shell and self.command_re.search(target) is not None


@dataclass
class Result:
    """What one run's replay checked and found."""

    run_id: str
    trees: int = 0
    nodes: int = 0
    edges: int = 0
    decisions: int = 0
    differences: list[str] = field(default_factory=list)


# ------------------------------------------------------------ the replay


def replay(data: Path, run_id: str) -> Result:
    """Rebuild run ``run_id`` and check every recorded decision (see the module docstring)."""
    ev = read_run(data, run_id)
    result = Result(run_id, decisions=ev["log"][0]["decisions"])
    if any(json.loads(s["weights"] or "{}").get("diversity") is not None for s in ev["paths_selected"]):
        raise SystemExit(f"{run_id}: a diversity reselection - the plain-Python baseline does not cover it")
    cfg = Config(ev["run_started"][0])
    tail = ev["log"][0]["tail"]
    trees = build_trees(ev, cfg)
    check_edges(ev, trees, result)
    points_of(ev, trees, tail)
    states = {t.tree_id: {w: state_at(t, w, cfg) for w in sorted(t.points)} for t in trees.values()}
    check_selections(ev, trees, states, cfg, result)
    check_stops(ev, trees, states, tail, result)
    check_path_selections(ev, trees, states, cfg, result)
    check_supervision(ev, trees, result)
    check_snapshots(ev, cfg, result)
    check_coverage(ev, trees, states, cfg, tail, result)
    result.trees = len(trees)
    result.nodes = sum(len(t.nodes) for t in trees.values())
    result.edges = sum(len(t.edges) for t in trees.values())
    return result


def build_trees(ev: dict[str, list[dict[str, Any]]], cfg: Config) -> dict[str, Tree]:
    """Trees with their nodes and edges: turns, verdicts, child ids, soft scores, lineage."""
    trees: dict[str, Tree] = {}
    for r in ev["root_added"]:
        if r["tree_id"] in trees:
            continue
        tree = trees[r["tree_id"]] = Tree(r["tree_id"], r["task"], r["stage"], r["agent_id"])
        score_o = cfg.oriented(r["score"])
        tree.nodes[r["tree_id"]] = Node(r["tree_id"], r["tree_id"], None, 0, score_o, 0, r["seq"], None, score_o)
    turns = turn_facts(ev, cfg)
    edges: dict[tuple[str, str], Edge] = {}
    for (tree_id, edge_id, turn), t in sorted(turns.items(), key=lambda kv: kv[1]["seq"]):
        parent, slot, attempt = EDGE_ID.match(edge_id).groups()
        edge = edges.setdefault(
            (tree_id, edge_id), Edge(tree_id, edge_id, parent, int(slot), int(attempt), parent.count(".") + 1)
        )
        if turn == 1:
            edge.s1, edge.turn1_seq = t["score"], t["seq"]
        else:
            edge.s2, edge.turn2_seq = t["score"], t["seq"]
        edge.tool_calls += t["calls"]
        edge.tool_errors += t["errors"]
        edge.knowledge_turns += t["knowledge"] >= 1
        if t["tok"] is not None and (turn == 2 or edge.tok is None):  # turn 2's, else turn 1's
            edge.tok = t["tok"]
    for r in ev["edge_started"]:
        edge = edges.get((r["tree_id"], r["edge_id"]))
        if edge is None:  # in flight: no turn finished yet
            edge = edges[(r["tree_id"], r["edge_id"])] = Edge(
                r["tree_id"], r["edge_id"], r["parent_id"], r["slot"], r["attempt"], r["parent_id"].count(".") + 1
            )
        edge.started_seq = r["seq"]
        edge.slot, edge.attempt, edge.parent_id = r["slot"], r["attempt"], r["parent_id"]
        trees[r["tree_id"]].edges[r["edge_id"]] = edge
    judge(list(edges.values()), trees, cfg)
    return trees


def turn_facts(ev: dict[str, list[dict[str, Any]]], cfg: Config) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per finished turn: seq, score, tool calls, errors, knowledge actions, steps, tokens, state."""
    calls: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in ev["tool_called"]:
        counts = calls[(c["tree_id"], c["edge_id"], c["turn"])]
        counts[0] += 1
        counts[1] += c["status"] == "error"
        counts[2] += cfg.is_knowledge(c["tool"], c["target"])
    steps: dict[tuple, int] = defaultdict(int)
    for s in ev["step_finished"]:
        steps[(s["tree_id"], s["edge_id"], s["turn"])] += 1
    model_calls: dict[tuple, int] = {}
    for c in ev["conversation_recorded"]:
        key = (c["tree_id"], c["edge_id"], c["turn"])
        model_calls[key] = max(model_calls.get(key, 0), c["model_calls"] or 0)
    scores = {}
    for e in ev["eval_finished"]:
        score = e["score"]
        scores[(e["tree_id"], e["edge_id"], e["turn"])] = score if score is not None and math.isfinite(score) else None
    out = {}
    for f in ev["turn_finished"]:
        key = (f["tree_id"], f["edge_id"], f["turn"])
        n_calls, errors, knowledge = calls.get(key, (0, 0, 0))
        out[key] = {
            "seq": f["seq"],
            "score": cfg.oriented(scores.get(key)),
            "calls": n_calls,
            "errors": errors,
            "knowledge": knowledge,
            "steps": max(steps.get(key, 0), model_calls.get(key, 0)),
            "tok": f["context_tokens"],
            "state": f["state"],
        }
    return out


def judge(edges: list[Edge], trees: dict[str, Tree], cfg: Config) -> None:
    """Verdicts and child ids in completion order, then nodes, lineage, soft scores and process."""
    prune = cfg.tree["tool_error_prune"]
    for e in edges:
        if e.turn1_seq is None:
            continue
        exempt = (e.layer == 1 and e.attempt >= 2) or e.layer == 2
        e.skip_turn2 = e.s1 is None and not exempt
        if e.turn2_seq is None and not e.skip_turn2:
            continue
        e.completed_seq = e.turn2_seq if e.turn2_seq is not None else e.turn1_seq
        rate = 0.0 if e.tool_calls == 0 else e.tool_errors / e.tool_calls
        hard_fail = e.s1 is None or e.s2 is None or rate > prune
        if e.layer == 1 and e.attempt == 1 and hard_fail:
            e.verdict = "retry"
        elif hard_fail:
            e.verdict = "kept_exempt" if exempt else "pruned"
        else:
            e.verdict = "kept"
    kept: dict[tuple[str, str], int] = defaultdict(int)
    for e in sorted((e for e in edges if e.verdict in ("kept", "kept_exempt")), key=lambda e: e.completed_seq):
        kept[(e.tree_id, e.parent_id)] += 1
        e.child_id = f"{e.parent_id}.{kept[(e.tree_id, e.parent_id)]}"
        scores = [s for s in (e.s1, e.s2) if s is not None]
        e.edge_score_o = max(scores) if scores else None
        last = e.s2 if e.s2 is not None else e.s1
        trees[e.tree_id].nodes[e.child_id] = Node(
            e.tree_id, e.child_id, e.parent_id, e.layer, e.edge_score_o, e.tok, e.completed_seq, e, last
        )
    for tree in trees.values():
        for n in sorted(tree.nodes.values(), key=lambda n: n.depth):  # parents before children
            p = tree.nodes.get(n.parent_id) if n.parent_id else None
            n.ref_o = n.score_o if n.score_o is not None else (p.ref_o if p else None)
            n.start_o = n.last_turn_score_o if n.last_turn_score_o is not None else (p.start_o if p else None)
            best = [s for s in (n.score_o, p.path_best_o if p else None) if s is not None]
            n.path_best_o = max(best) if best else None
    for e in edges:
        if e.verdict is not None:
            score_soft(e, trees[e.tree_id].nodes.get(e.parent_id), cfg)
    for tree in trees.values():
        for n in tree.nodes.values():
            softs = [a.edge.soft for a in lineage(tree, n) if a.edge is not None]
            n.process = mean(softs) or 0.0


def score_soft(e: Edge, parent: Node | None, cfg: Config) -> None:
    """improved, cleanliness, knowledge, regression stability and soft of one judged edge."""
    s = cfg.soft
    ref_o = parent.ref_o if parent else None
    start_o = parent.start_o if parent else None
    scores = [x for x in (e.s1, e.s2) if x is not None]
    e.edge_score_o = max(scores) if scores else None
    if e.edge_score_o is not None and ref_o is not None:
        e.improved = e.edge_score_o > ref_o
    rate = 0.0 if e.tool_calls == 0 else e.tool_errors / e.tool_calls
    e.cleanliness = (
        s["cleanliness_clean"]
        if rate == 0
        else max(
            s["cleanliness_floor"],
            s["cleanliness_start"] - s["cleanliness_slope"] * rate / cfg.tree["tool_error_prune"],
        )
    )
    has_knowledge = e.knowledge_turns >= 2
    # A turn regresses when its score is missing or below where it started (turn 2: from turn 1).
    turn2_start = e.s1 if e.s1 is not None else start_o
    regressed = (e.s1 is None or (start_o is not None and e.s1 < start_o)) + (
        e.s2 is None or (turn2_start is not None and e.s2 < turn2_start)
    )
    stability = 1.0 - regressed / 2.0
    if e.improved is None:
        return
    outcome = s["outcome_improved"] if e.improved else s["outcome_not_improved"]
    e.knowledge = s[
        ("knowledge_improved_" if e.improved else "knowledge_not_improved_") + ("with" if has_knowledge else "without")
    ]
    e.soft = (
        s["outcome"] * outcome
        + s["cleanliness"] * e.cleanliness
        + s["knowledge"] * e.knowledge
        + s["regression"] * stability
    )


def lineage(tree: Tree, node: Node) -> list[Node]:
    """The nodes on root..node."""
    out = []
    n: Node | None = node
    while n is not None:
        out.append(n)
        n = tree.nodes.get(n.parent_id) if n.parent_id else None
    return out[::-1]


def check_edges(ev: dict[str, list[dict[str, Any]]], trees: dict[str, Tree], result: Result) -> None:
    """Each recorded verdict and skip against the derived one; derived ones never recorded."""
    judged = defaultdict(list)
    for r in ev["edge_judged"]:
        judged[(r["tree_id"], r["edge_id"])].append(r)
    skipped = {(r["tree_id"], r["edge_id"]): r for r in ev["turn_skipped"]}
    edges = {(t.tree_id, e.edge_id): e for t in trees.values() for e in t.edges.values()}
    for key, records in judged.items():
        e = edges.get(key)
        for r in records:
            if e is None or e.completed_seq is None or e.completed_seq > r["watermark"]:
                result.differences.append(f"{key}: judged before the edge was complete")
            elif len(records) > 1:
                result.differences.append(f"{key}: judged more than once")
            elif r["verdict"] != e.verdict or r["child_id"] != e.child_id:
                result.differences.append(
                    f"{key}: verdict {r['verdict']} -> {r['child_id']}, derived {e.verdict} -> {e.child_id}"
                )
    for key, e in edges.items():
        if e.verdict is not None and key not in judged:
            result.differences.append(f"{key}: no verdict recorded")
        if e.skip_turn2 and key not in skipped:
            result.differences.append(f"{key}: no skip recorded")
    for key, r in skipped.items():
        e = edges.get(key)
        if e is None or e.turn1_seq is None or e.turn1_seq > r["watermark"]:
            result.differences.append(f"{key}: skipped before turn 1 finished")
        elif not e.skip_turn2 or e.turn2_seq is not None:
            result.differences.append(f"{key}: skip not implied")


def points_of(ev: dict[str, list[dict[str, Any]]], trees: dict[str, Tree], tail: int) -> None:
    """Each tree's evaluation points: now, its selections' and stops' watermarks, every path selection's."""
    for tree in trees.values():
        tree.points.add(tail)
    for kind in ("node_selected", "tree_stopped"):
        for r in ev[kind]:
            trees[r["tree_id"]].points.add(r["watermark"])
    for r in ev["paths_selected"]:
        for tree in trees.values():
            tree.points.add(r["watermark"])


@dataclass
class State:
    """A tree at one point: the nodes present with their leaf reason, Q, T, Select; stop and next work."""

    nodes: dict[str, dict[str, Any]]
    stop_reason: str | None
    is_done: bool
    next_work: tuple | None  # (kind, node_id or edge, select, q, t)


def state_at(tree: Tree, w: int, cfg: Config) -> State:
    """The tree as the log prefix 1..w shows it (ALGORITHM §2)."""
    t = cfg.tree
    present = {n.node_id: n for n in tree.nodes.values() if n.created_seq <= w}
    started = [e for e in tree.edges.values() if e.started_seq <= w]
    children: dict[str, int] = defaultdict(int)
    for n in present.values():
        if n.parent_id is not None:
            children[n.parent_id] += 1
    failed: dict[str, int] = defaultdict(int)
    in_flight: dict[str, int] = defaultdict(int)
    started_from: dict[str, int] = defaultdict(int)
    for e in started:
        started_from[e.parent_id] += 1
        done = e.completed_seq is not None and e.completed_seq <= w
        failed[e.parent_id] += e.verdict == "pruned" and done
        in_flight[e.parent_id] += not done
    rows = {}
    for n in present.values():
        valid, fails = children[n.node_id], failed[n.node_id]
        reason = None
        if n.depth > 0 and n.tok >= t["hard_token_limit"]:
            reason = "token"
        elif n.depth >= t["max_depth"]:
            reason = "depth"
        elif n.depth > 0 and valid == 0 and fails >= t["max_failed_expansions"]:
            reason = "exhausted"
        active = (
            0 < n.depth < t["max_depth"]
            and n.tok < t["hard_token_limit"]
            and valid < t["max_children"]
            and fails < t["max_failed_expansions"]
            and in_flight[n.node_id] == 0
        )
        rows[n.node_id] = {"node": n, "valid": valid, "reason": reason, "active": active}
    scores = sorted(r["node"].score_o for r in rows.values() if r["node"].score_o is not None)
    bests = sorted(r["node"].path_best_o for r in rows.values() if r["node"].path_best_o is not None)
    toks = sorted(-r["node"].tok for r in rows.values() if r["active"])
    q = cfg.q
    for r in rows.values():
        n = r["node"]
        score_rank = 0.0 if n.score_o is None else pct(*counts_in(scores, n.score_o), len(scores))
        best_rank = (
            pct(*counts_in(bests, n.path_best_o), len(rows)) if n.path_best_o is not None else pct(0, 0, len(rows))
        )
        r["t"] = pct(*counts_in(toks, -n.tok), len(toks)) if r["active"] else None
        r["q"] = q["score_rank"] * score_rank + q["best_rank"] * best_rank + q["process"] * n.process
        r["select"] = r["q"] + t["alpha"] * r["t"] if r["t"] is not None else None
    good = sum(r["reason"] is not None for r in rows.values())
    kept = sum(n.depth > 0 for n in present.values())
    active = sum(r["active"] for r in rows.values())
    flying = sum(in_flight.values())
    root_edges = [e for e in started if e.layer == 1]
    slots = {e.slot for e in root_edges}
    owed = [e for e in root_edges if e.verdict == "retry" and e.completed_seq <= w]
    pending_retries = len(owed) - sum(e.attempt >= 2 for e in root_edges)
    pending_fanout = max(0, t["root_children"] - len(slots))
    stop = None
    if good >= t["target_good_leaves"]:
        stop = "good_leaves"
    elif kept > t["max_valid_edges"]:
        stop = "max_edges"
    elif active == 0 and flying == 0 and pending_fanout == 0 and pending_retries == 0:
        stop = "exhausted"
    work = None
    if stop is None:
        fanout = [s for s in range(1, t["root_children"] + 1) if s not in slots]
        retried = {(e.slot, e.attempt) for e in root_edges}
        retries = sorted((e for e in owed if (e.slot, e.attempt + 1) not in retried), key=lambda e: e.completed_seq)
        if fanout:
            work = ("fanout", f"{tree.tree_id}/e{fanout[0]}-1", None, None, None)
        elif retries:
            work = ("retry", f"{tree.tree_id}/e{retries[0].slot}-{retries[0].attempt + 1}", None, None, None)
        else:
            candidates = [r for r in rows.values() if r["active"]]
            if candidates:
                best = min(candidates, key=lambda r: (-round(r["select"], 12), node_key(r["node"].node_id)))
                work = ("select", best["node"].node_id, best["select"], best["q"], best["t"])
    done = stop is not None and flying == 0
    if done:
        for r in rows.values():
            if r["reason"] is None and r["node"].depth > 0 and r["valid"] == 0:
                r["reason"] = "stopped"
    return State(rows, stop, done, work)


def check_selections(ev, trees, states, cfg, result) -> None:
    """Each NodeSelected: at its watermark the next work is a selection of that node, same Select, Q, T."""
    for r in ev["node_selected"]:
        work = states[r["tree_id"]][r["watermark"]].next_work
        if work is None or work[0] != "select" or work[1] != r["node_id"]:
            result.differences.append(f"node_selected {r['seq']}: recorded {r['node_id']}, derived {work}")
        elif any(differs(a, b) for a, b in zip(work[2:], (r["select_score"], r["q"], r["t"]), strict=True)):
            result.differences.append(f"node_selected {r['seq']}: scores differ ({work[2:]})")


def check_stops(ev, trees, states, tail, result) -> None:
    """Each TreeStopped against the stop at its watermark; starts after a stop; done trees never stopped."""
    first_stop = {}
    for r in ev["tree_stopped"]:
        first_stop.setdefault(r["tree_id"], r["seq"])
        derived = states[r["tree_id"]][r["watermark"]].stop_reason
        if derived != r["reason"]:
            result.differences.append(f"tree_stopped {r['seq']}: recorded {r['reason']}, derived {derived}")
    for r in ev["edge_started"]:
        if r["tree_id"] in first_stop and r["seq"] > first_stop[r["tree_id"]]:
            result.differences.append(f"{r['edge_id']}: edge started after the tree stopped")
    if ev["run_finished"]:
        for tree_id, by_point in states.items():
            if by_point[tail].is_done and tree_id not in first_stop:
                result.differences.append(f"{tree_id}: no stop recorded")


def paths_at(tree: Tree, state: State, cfg: Config, weights: dict[str, float], top_k: int) -> list[dict[str, Any]]:
    """The candidate paths of a tree at one point with their metrics, ranks, PathScore and Top-k rank."""
    paths = []
    for leaf_id, r in state.nodes.items():
        if r["node"].depth == 0 or r["reason"] is None:
            continue
        steps = [n for n in lineage(tree, r["node"]) if n.depth > 0]
        ranked = all(n.score_o is not None and n.edge.knowledge is not None for n in steps)
        scores = [n.score_o for n in steps if n.score_o is not None]
        paths.append(
            {
                "tree_id": tree.tree_id,
                "leaf_id": leaf_id,
                "ranked": ranked,
                "depth": r["node"].depth,
                "edges": [n.edge.edge_id for n in steps],
                "avg_clean": mean([n.edge.cleanliness for n in steps]),
                "avg_know": mean([n.edge.knowledge for n in steps]),
                "avg": mean(scores),
                "max": max(scores) if scores else None,
            }
        )
    ranked = [p for p in paths if p["ranked"]]
    avgs, maxes = sorted(p["avg"] for p in ranked), sorted(p["max"] for p in ranked)
    for p in ranked:
        p["path_score"] = (
            weights["max"] * pct(*counts_in(maxes, p["max"]), len(ranked))
            + weights["avg"] * pct(*counts_in(avgs, p["avg"]), len(ranked))
            + weights["clean"] * p["avg_clean"]
            + weights["know"] * p["avg_know"]
        )
    for rank, p in enumerate(sorted(ranked, key=lambda p: (-round(p["path_score"], 12), node_key(p["leaf_id"]))), 1):
        p["rank"], p["selected"] = rank, rank <= top_k
    for p in paths:
        p.setdefault("rank", None)
        p.setdefault("path_score", None)
        p.setdefault("selected", False)
    return paths


def check_path_selections(ev, trees, states, cfg, result) -> None:
    """Each PathsSelected: at its watermark, with its weights and k, exactly its paths, ranks and scores."""
    for r in ev["paths_selected"]:
        weights = json.loads(r["weights"])
        derived = {
            (p["tree_id"], p["leaf_id"]): p
            for t in trees.values()
            for p in paths_at(t, states[t.tree_id][r["watermark"]], cfg, weights, r["top_k"])
            if p["selected"]
        }
        recorded = {(p["tree_id"], p["leaf_id"]): p for p in json.loads(r["paths"])}
        for key in recorded.keys() | derived.keys():
            a, b = recorded.get(key), derived.get(key)
            if a is None or b is None or a["rank"] != b["rank"] or differs(a["path_score"], b["path_score"]):
                result.differences.append(f"paths_selected {r['seq']} {key}: recorded {a}, derived {b}")


def r12(x: float) -> float:
    """``x`` rounded to 12 decimals, half away from zero (as DuckDB's ``round``)."""
    return math.copysign(math.floor(abs(x) * 1e12 + 0.5), x) / 1e12


def check_supervision(ev, trees, result) -> None:
    """Each SupervisionSelected: at its watermark, under its rule, exactly its pairs (and margins),
    labels (and values) and step paths (their edges and labels). Under ``against_verdict = 'drop'`` no
    pair's chosen attempt failed the prune test (pruned, retry, kept_exempt) while the rejected one
    passed it (kept); a selection recorded before the rule had this part kept such pairs."""
    failed = ("pruned", "retry", "kept_exempt")
    for r in ev["supervision_selected"]:
        w, threshold, margin = r["watermark"], r12(r["threshold"]), r12(r["min_margin"])
        drop = (r.get("against_verdict") or "keep") == "drop"
        done = [e for t in trees.values() for e in t.edges.values() if e.verdict and e.completed_seq <= w]
        value = {e.edge_id: r12(e.soft or 0.0) if r["rule"] == "soft" else (1.0 if e.improved else 0.0) for e in done}
        labels = {(e.tree_id, e.edge_id): (value[e.edge_id] >= threshold, value[e.edge_id]) for e in done}
        by_node: dict[tuple[str, str], list[Edge]] = defaultdict(list)
        for e in done:
            by_node[(e.tree_id, e.parent_id)].append(e)
        pairs = {
            (c.tree_id, c.parent_id, c.edge_id, o.edge_id): r12(value[c.edge_id] - value[o.edge_id])
            for attempts in by_node.values()
            for c in attempts
            for o in attempts
            if value[c.edge_id] > value[o.edge_id]
            and r12(value[c.edge_id] - value[o.edge_id]) >= margin
            and not (drop and c.verdict in failed and o.verdict == "kept")
        }
        kept = {(e.tree_id, e.child_id): e for e in done if e.child_id is not None}
        parents = {(e.tree_id, e.parent_id) for e in kept.values()}
        steps = {}
        for (tree_id, leaf), _ in kept.items():
            if (tree_id, leaf) in parents:
                continue
            ids = leaf.split(".")  # the leaf and its ancestors: its id's prefixes
            prefixes = (".".join(ids[:n]) for n in range(1, len(ids) + 1))
            path = sorted((kept[(tree_id, c)] for c in prefixes if (tree_id, c) in kept), key=lambda e: e.layer)
            steps[(tree_id, leaf)] = ([e.edge_id for e in path], [labels[(tree_id, e.edge_id)][0] for e in path])
        recorded_pairs = {
            (p["tree_id"], p["node_id"], p["chosen_id"], p["rejected_id"]): p["margin"] for p in json.loads(r["pairs"])
        }
        recorded_labels = {(x["tree_id"], x["edge_id"]): (x["label"], x["value"]) for x in json.loads(r["labels"])}
        recorded_steps = {
            (x["tree_id"], x["leaf_id"]): (x["edge_ids"], x["step_labels"]) for x in json.loads(r["step_paths"])
        }
        for key in recorded_pairs.keys() | pairs.keys():
            a, b = recorded_pairs.get(key), pairs.get(key)
            if a is None or b is None or differs(a, b):
                result.differences.append(f"supervision_selected {r['seq']} pair {key}: recorded {a}, derived {b}")
        for key in recorded_labels.keys() | labels.keys():
            a, b = recorded_labels.get(key), labels.get(key)
            if a is None or b is None or a[0] != b[0] or differs(a[1], b[1]):
                result.differences.append(f"supervision_selected {r['seq']} label {key}: recorded {a}, derived {b}")
        for key in recorded_steps.keys() | steps.keys():
            a, b = recorded_steps.get(key), steps.get(key)
            if a is None or b is None or list(a[0]) != b[0] or list(a[1]) != b[1]:
                result.differences.append(f"supervision_selected {r['seq']} steps {key}: recorded {a}, derived {b}")


def staged(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """The candidates of one task with score for stage, smoothing, gain and stage (ALGORITHM §1.3-1.6)."""
    cands = sorted(
        (dict(r) for r in rows if r["skip_reason"] is None), key=lambda r: (r["global_index"], r["snapshot"])
    )
    n = len(cands)
    scores = [cfg.oriented(c["score"]) for c in cands]
    for i, c in enumerate(cands):
        before = [s for s in scores[:i] if s is not None]
        after = [s for s in scores[i + 1 :] if s is not None]
        nearest = before[-1] if before else (after[0] if after else None)
        c["for_stage"] = scores[i] if scores[i] is not None else nearest
    for i, c in enumerate(cands):
        c["smooth"] = mean([x["for_stage"] for x in cands[max(0, i - 2) : i + 3]])
    s0 = mean([c["smooth"] for c in cands[: max(1, (n + 19) // 20)]])
    s_inf = mean([c["smooth"] for c in cands[n - max(1, (n + 4) // 5) :]])
    uses_gain = s0 is not None and s_inf is not None and s_inf > s0
    for i, c in enumerate(cands):
        c["gain"] = min(1.0, max(0.0, (c["smooth"] - s0) / (s_inf - s0))) if uses_gain else None
        if uses_gain:
            c["stage"] = "early" if c["gain"] < 0.5 else "middle" if c["gain"] < 0.9 else "late"
        else:
            c["stage"] = "early" if i < (n + 5) // 10 else "middle" if i < (n + 1) // 2 else "late"
        c["eligible"] = bool(c["eval_ok"]) and c["score"] is not None
    return cands


def picked(cands: list[dict[str, Any]], num_roots: int) -> dict[str, str]:
    """Snapshot -> reason (quota or fill) of the picks (ALGORITHM §1.7-1.10)."""
    r = num_roots
    quotas = {"early": (r + 3) // 6, "middle": (r + 1) // 2}
    quotas["late"] = r - quotas["early"] - quotas["middle"]
    eligible = {s: [c for c in cands if c["eligible"] and c["stage"] == s] for s in quotas}
    picks = {}
    for stage, quota in quotas.items():
        n = len(eligible[stage])
        for j in range(min(quota, n)):
            picks[eligible[stage][j if quota >= n else ((2 * j + 1) * n) // (2 * quota)]["snapshot"]] = "quota"
    deficit = sum(max(0, quotas[s] - len(eligible[s])) for s in quotas)
    available_before = 0
    for stage in ("middle", "late", "early"):
        unpicked_count = max(0, len(eligible[stage]) - quotas[stage])
        extra = max(0, min(unpicked_count, deficit - available_before))
        available_before += unpicked_count
        unpicked = [c for c in eligible[stage] if c["snapshot"] not in picks]
        for j in range(extra):
            picks[unpicked[((2 * j + 1) * unpicked_count) // (2 * extra)]["snapshot"]] = "fill"
    return picks


def check_snapshots(ev, cfg, result) -> None:
    """Each SnapshotsPicked: every candidate's stage, gain, pick and reason from the facts it saw."""
    for r in ev["snapshots_picked"]:
        cands = staged([s for s in ev["snapshot_seen"] if s["task"] == r["task"] and s["seq"] <= r["watermark"]], cfg)
        picks = picked(cands, cfg.num_roots)
        derived = {
            c["snapshot"]: (c["stage"], c["gain"], c["snapshot"] in picks, picks.get(c["snapshot"])) for c in cands
        }
        recorded = {d["snapshot"]: (d["stage"], d["gain"], d["selected"], d["reason"]) for d in json.loads(r["detail"])}
        for snap in recorded.keys() | derived.keys():
            a, b = recorded.get(snap), derived.get(snap)
            if a is None or b is None or a[0] != b[0] or differs(a[1], b[1]) or a[2:] != b[2:]:
                result.differences.append(f"snapshots_picked {r['seq']} {snap}: recorded {a}, derived {b}")


def check_coverage(ev, trees, states, cfg, tail, result) -> None:
    """Replay's coverage checks: N_eff <= N in every stratum, quota picks within quotas, shares in [0, 1]."""
    p = cfg.paths
    weights = {k: p[k] for k in ("max", "avg", "clean", "know")}
    selected = [
        path
        for t in trees.values()
        for path in paths_at(t, states[t.tree_id][tail], cfg, weights, p["top_k"])
        if path["selected"]
    ]
    strata: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for path in selected:
        t = trees[path["tree_id"]]
        task, stage, agent = t.task or "none", t.stage or "none", t.agent_id or "none"
        for key in (
            ("all", "all"),
            ("task", task),
            ("stage", stage),
            ("lineage", f"{task} / {agent} / {stage}"),
            ("root", t.tree_id),
            ("depth", str(path["depth"])),
        ):
            strata[key].append(path)
    for key, paths in strata.items():
        through: dict[tuple[str, str], int] = defaultdict(int)
        for path in paths:
            for e in path["edges"]:
                through[(path["tree_id"], e)] += 1
        n_eff = sum(1.0 / (through[(path["tree_id"], e)] * len(path["edges"])) for path in paths for e in path["edges"])
        if n_eff > len(paths) + 1e-9 or n_eff < -1e-9:
            result.differences.append(f"coverage {key}: N_eff {n_eff} with N {len(paths)}")
    r = cfg.num_roots
    quotas = {"early": (r + 3) // 6, "middle": (r + 1) // 2}
    quotas["late"] = r - quotas["early"] - quotas["middle"]
    for task in sorted({s["task"] for s in ev["snapshot_seen"]}):
        cands = staged([s for s in ev["snapshot_seen"] if s["task"] == task], cfg)
        picks = picked(cands, cfg.num_roots)
        for stage, quota in quotas.items():
            if sum(1 for c in cands if c["stage"] == stage and picks.get(c["snapshot"]) == "quota") > quota:
                result.differences.append(f"coverage {task}:{stage}: quota picks beyond the quota")
    for t in trees.values():
        kept = [e for e in t.edges.values() if e.verdict in ("kept", "kept_exempt")]
        improved = sum(bool(e.improved) for e in kept)
        if kept and not 0 <= improved / len(kept) <= 1:
            result.differences.append(f"coverage {t.tree_id}: learnability share outside [0, 1]")
