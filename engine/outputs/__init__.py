"""Each command's result as it prints it: the JSON document of --json and the lines of text.

One function per result, returning an :class:`~engine.render.Output`; the command line
picks the format. Hints in the text are command lines that work as printed (they carry
a --data other than ./data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.outputs.integrity import campaign_verification, quarantined, verification, verified
from engine.render import Output, counted, rows_csv, table
from ingest.paths import command_line

Row = dict[str, Any]
__all__ = ["campaign_verification", "quarantined", "verification", "verified"]  # (engine/outputs/integrity.py)

EXPLORE_COLUMNS = [
    "tree_id",
    "stage",
    "root_score",
    "best_score",
    "kept_edges",
    "good_leaves",
    "final_leaves",
    "stop_reason",
    "paths",
    "ranked",
    "selected",
    "top_path_score",
]
REPLAY_COLUMNS = [
    "tree_id",
    "nodes",
    "kept_edges",
    "kept_exempt_edges",
    "pruned_edges",
    "retried_edges",
    "depth_leaves",
    "token_leaves",
    "exhausted_leaves",
    "stopped_leaves",
    "stop_reason",
    "best_score",
]
PATH_COLUMNS = [
    "tree_id",
    "leaf_id",
    "rank",
    "path_score",
    "max_score",
    "max_score_rank",
    "avg_score",
    "avg_score_rank",
    "avg_cleanliness",
    "avg_knowledge",
    "task",
    "stage",
    "snapshot",
]
COVERAGE_COLUMNS = [
    "run_id",
    "stratum",
    "stratum_key",
    "roots",
    "candidate_paths",
    "ranked_paths",
    "selected_paths",
    "n_eff",
    "n_eff_ratio",
    "kept_edges",
    "kept_exempt_edges",
    "pruned_edges",
    "retried_edges",
    "quota_fill",
]
PICK_FIELDS = ("snapshot", "global_index", "agent_id", "score", "stage", "selection_reason")


def views(defs: dict[str, Any]) -> Output:
    lines = []
    for v in defs.values():
        lines += [f"{v.name}\n    {v.summary}\n    grain: {', '.join(v.grain)}", f"    sources: {', '.join(v.sources)}"]
    return Output(
        [
            {"view": v.name, "summary": v.summary, "grain": list(v.grain), "sources": list(v.sources), "notes": v.notes}
            for v in defs.values()
        ],
        lines,
    )


def selection(result: Any) -> Output:
    """select-snapshots: the stages' quotas and fills, the picks."""
    document = {
        "run_id": result.run_id,
        "task": result.task,
        "direction": result.direction,
        "num_roots": result.num_roots,
        "out": str(result.out),
        "stages": result.stages,
        "picks": [{k: p[k] for k in PICK_FIELDS} for p in result.picks],
        "skipped": result.skipped,
        "warnings": result.warnings,
    }
    columns = ["stage", "candidates", "eligible", "quota", "picked_quota", "fills", "picked"]
    lines = [
        f"run {result.run_id}: task {result.task} ({result.direction}), R={result.num_roots}",
        table(result.stages, columns),
        f"picked {sum(s['picked'] for s in result.stages)} snapshots -> {result.out}",
    ]
    if result.skipped:
        lines.append(f"skipped {len(result.skipped)} folders:")
        lines += [f"  {s['snapshot']}: {s['skip_reason']}" for s in result.skipped]
    return Output(document, lines)


def exploration(result: Any, data_dir: Path) -> Output:
    """explore's summary: the run's counts, a row per tree, the selected paths."""
    p = result.progress
    selected = sum(t["selected"] for t in result.trees)
    lines = [
        f"run {result.run_id}: {p['trees_done']}/{p['trees']} trees done; edges kept "
        f"{p['kept_edges']} ({p['kept_exempt_edges']} exempt), pruned {p['pruned_edges']}, "
        f"retried {p['retried_edges']}; leaves {p['leaves']}",
        table(result.trees, EXPLORE_COLUMNS),
        f"Top-{result.top_k}: {selected} paths selected over {len(result.trees)} roots "
        f"({command_line(data_dir, 'paths', result.run_id)})",
    ]
    if result.supervision:
        pairs = sum(c["pairs"] for c in result.supervision)
        forks = sum(c["fork_points"] for c in result.supervision)
        out = f"data/out/{result.run_id}-pairs"  # (not README's next step's data/out/pairs)
        export = command_line(data_dir, "export", result.run_id, "--format", "dpo", "--out", out)
        lines.append(f"preference pairs: {pairs} at {forks} fork points ({export})")
    document = {"run_id": result.run_id, "progress": result.progress, "trees": result.trees}
    return Output(document | {"supervision": result.supervision}, lines)


CAMPAIGN_COLUMNS = ["task", "run_id", "roots", "kept_edges", "tokens", "n", "n_eff", "n_eff_ratio", "stages_covered"]


def campaign(result: Any, data_dir: Path) -> Output:
    """campaign's summary: how it stopped, a row per task (N, N_eff, N_eff/N, stages, edges, tokens), the total."""
    from engine.campaign.policy import spent

    rows = [r | {"stages_covered": f"{r['stages_covered']}/{r['stages']}"} for r in result.summary]
    n = sum(r["n"] or 0 for r in result.summary)
    n_eff = sum(r["n_eff"] or 0.0 for r in result.summary)
    edges, tokens = spent(result.summary)
    total = {
        "task": "total",
        "run_id": "",
        "roots": sum(r["roots"] for r in result.summary),
        "kept_edges": edges,
        "tokens": tokens,
        "n": n,
        "n_eff": n_eff,
        "n_eff_ratio": n_eff / n if n else None,
        "stages_covered": "",
    }
    stop = f", stopped: {result.stop_reason}" if result.stop_reason else ""
    lines = [
        f"campaign {result.name} ({result.policy}): {counted(len(result.runs), 'task')}, "
        f"{counted(result.rounds, 'round')}{stop}",
        table([*rows, total], CAMPAIGN_COLUMNS),
        f"every task's run is a run as any other: {command_line(data_dir, 'audit', result.name)}",
    ]
    document = {
        "campaign": result.name,
        "policy": result.policy,
        "resumed": result.resumed,
        "rounds": result.rounds,
        "stop_reason": result.stop_reason,
        "runs": result.runs,
        "tasks": result.summary,
        "total": total,
    }
    return Output(document, lines)


def resuming(run_id: str, p: Row) -> str:
    """The line explore --resume starts with."""
    if p["finished"]:
        return f"run {run_id}: finished already ({p['trees_done']}/{p['trees']} trees done)"
    return (
        f"run {run_id}: resuming task {p['task']} ({p['direction']}): {p['trees_done']}/{p['trees']} trees done, "
        f"{p['kept_edges']} edges kept, {p['in_flight_edges']} edges in flight"
    )


def replay(result: Any, tree_id: str | None, drawing: list[str]) -> Output:
    """replay of one run: its trees, the tree drawn (``tree_id``), the differences, a count."""
    differ = len(result.differences)
    document = {
        "run_id": result.run_id,
        "decisions": result.decisions,
        "differ": differ,
        "trees": result.trees,
        "differences": [vars(d) for d in result.differences],
        **({"drawing": {"tree_id": tree_id, "lines": drawing}} if tree_id else {}),
    }
    shown = [t for t in result.trees if t["tree_id"] == tree_id] if tree_id else result.trees  # (--tree: its row)
    lines = [table(shown, REPLAY_COLUMNS)]
    if tree_id:
        lines += [f"\ntree {tree_id} (* = on a selected path, x = attempt without a node)", "\n".join(drawing)]
    lines += [difference(d) for d in result.differences]
    lines.append(f"replay: {result.decisions} decisions re-derived, {differ} differ")
    return Output(document, lines)


def replayed_run(result: Any) -> Output:
    """One run of a replay of several: its document, and its line with its differences."""
    differ = len(result.differences)
    lines = [
        f"run {result.run_id}: {len(result.trees)} trees, {result.decisions} decisions re-derived, {differ} differ"
    ] + ["  " + difference(d) for d in result.differences]
    return Output(
        {
            "run_id": result.run_id,
            "decisions": result.decisions,
            "differ": differ,
            "trees": result.trees,
            "differences": [vars(d) for d in result.differences],
        },
        lines,
    )


def replayed_campaign(result: Any) -> Output:
    """replay of a campaign: its rounds re-derived (their differences), then a line per run, a total."""
    runs = [replayed_run(r) for r in result.runs]
    differ = len(result.differences) + sum(len(r.differences) for r in result.runs)
    decisions = result.decisions + sum(r.decisions for r in result.runs)
    lines = [f"campaign {result.name}: {result.decisions} decisions re-derived, {len(result.differences)} differ"]
    lines += ["  " + difference(d) for d in result.differences]
    lines += [line for r in runs for line in r.lines]
    lines.append(
        f"replay: campaign {result.name} and {len(runs)} runs, {decisions} decisions re-derived, {differ} differ"
    )
    document = {
        "campaign": result.name,
        "decisions": decisions,
        "differ": differ,
        "differences": [vars(d) for d in result.differences],
        "runs": [r.document for r in runs],
    }
    return Output(document, lines)


def replayed_runs(runs: list[Any], count: int, decisions: int, differ: int) -> Output:
    """The end of a replay of several runs: the runs' documents (``runs``), a total."""
    plural = f"{count} run{'s' if count != 1 else ''}"
    return Output(
        {"runs": runs, "decisions": decisions, "differ": differ},
        [f"replay: {plural}, {decisions} decisions re-derived, {differ} differ"],
    )


def difference(d: Any) -> str:
    return (
        f"decision {d.seq if d.seq is not None else '-'} {d.kind} {d.subject}: "
        f"{d.problem}; recorded: {d.recorded or '-'}; log implies: {d.derived or '-'}"
    )


def paths(chosen: Row, rows: list[Row]) -> Output:
    """The selected paths of a run: a table, or CSV with their node ids."""
    csv_rows = ([r.get(c) for c in PATH_COLUMNS] + [" ".join(r["node_ids"])] for r in rows)
    return Output(
        {"selection_id": chosen["selection_id"], "weights": chosen["weights"], "top_k": chosen["top_k"], "paths": rows},
        [
            f"selection {chosen['selection_id']}: weights {chosen['weights']}, top-{chosen['top_k']}",
            table(rows, PATH_COLUMNS[:-1]),
        ],
        ([*PATH_COLUMNS, "node_ids"], csv_rows),
    )


def supervision(result: Any) -> Output:
    """reselect --rule: the supervision selection and its counts by task and stage."""
    sel = result.selection
    document = {
        "selection_id": sel["selection_id"],
        "appended": result.appended,
        "rule": sel["rule"],
        "min_margin": sel["min_margin"],
        "threshold": sel["threshold"],
        "against_verdict": sel["against_verdict"],
        "counts": result.counts,
    }
    state = "appended" if result.appended else "already recorded"
    columns = ["task", "stage", "pairs", "against_verdict", "fork_points", "pair_n_eff", "good", "bad", "step_paths"]
    lines = [
        f"supervision selection {sel['selection_id']} ({state}): rule {sel['rule']}, "
        f"min margin {sel['min_margin']:g}, threshold {sel['threshold']:g}, "
        f"pairs against the tree's verdict: {sel['against_verdict']}",
        table(result.counts, columns) if result.counts else "no finished attempt: nothing to pair or label",
    ]
    return Output(document, lines)


def reselection(result: Any) -> Output:
    """reselect: the selection, and how it differs from the run's default one."""
    sel = result.selection
    document = {
        "selection_id": sel["selection_id"],
        "appended": result.appended,
        "weights": sel["weights"],
        "top_k": sel["top_k"],
        "paths": sel["paths"],
        "compared_with": result.default_id,
        "paths_in": result.added,
        "paths_out": result.removed,
        "comparison": result.comparison,
    }
    state = "appended" if result.appended else "already recorded"
    lines = [
        f"selection {sel['selection_id']} ({state}): weights {sel['weights']}, top-{sel['top_k']}",
        table(sel["paths"], ["tree_id", "leaf_id", "rank", "path_score"]),
    ]
    total = sum(v for k, v in sel["weights"].items() if k != "diversity")
    if abs(total - 1) > 1e-9:  # accepted (only the order counts), but not silently
        lines.insert(1, f"note: the weights sum to {total:g}, not 1: these path scores are on another scale")
    if result.default_id:
        lines.append(
            f"versus the default selection {result.default_id}: {len(result.added)} paths in, {len(result.removed)} out"
        )
        for tree in sorted({p["tree_id"] for p in result.added + result.removed}):
            ins = [p["leaf_id"] for p in result.added if p["tree_id"] == tree]
            outs = [p["leaf_id"] for p in result.removed if p["tree_id"] == tree]
            lines.append(f"  {tree}: in {', '.join(ins) or '-'}; out {', '.join(outs) or '-'}")
        if sel["weights"].get("diversity") is not None:
            lines += [
                "N_eff/N and mean PathScore, default -> this selection:",
                table(
                    result.comparison,
                    ["tree_id", "n_eff_ratio_default", "n_eff_ratio", "mean_path_score_default", "mean_path_score"],
                ),
            ]
    return Output(document, lines)


def export(result: Any, invalid: str) -> Output:
    """export: a line per run's file, the counts, what a trainer must know of the samples."""
    m = result.manifest
    lines = [
        f"run {run['run_id']}: selection {run['selection_id']}, {run['samples']} samples -> {run['file']}"
        for run in m["runs"]
    ]
    counts = ", ".join(f"{t} {s} {n}" for t, stages in m["counts"].items() for s, n in stages.items())
    lines.append(f"{m['samples']} {m['format']} samples ({counts}) in {result.out}")
    flagged = sum(r["invalid_call_samples"] for r in m["runs"])
    if flagged:
        what = "left out" if invalid == "drop" else "kept; --invalid-calls drop leaves them out"
        lines.append(f"{flagged} samples hold a call of a tool the model was not offered ({what})")
    for run in m["runs"]:
        left = {k: n for k, n in run.get("left_out", {}).items() if n and k != "invalid_calls"}
        if left:
            lines.append(f"run {run['run_id']}: left out {', '.join(f'{n} {k}' for k, n in left.items())}")
        if run.get("against_verdict_pairs"):
            lines.append(
                f"run {run['run_id']}: {run['against_verdict_pairs']} pairs prefer an attempt that failed the "
                "tree's prune test over one that passed it (metadata.against_verdict)"
            )
        if run.get("supervision"):
            lines += [
                f"run {run['run_id']}: rule {run['rule']}, min margin {run['min_margin']:g}, "
                f"threshold {run['threshold']:g}, pairs against the tree's verdict: {run['against_verdict']} "
                "(the whole selection; pairs at one node share a prompt):",
                table(
                    run["supervision"],
                    ["task", "stage", "pairs", "against_verdict", "fork_points", "pair_n_eff", "good", "bad"],
                ),
            ]
    if "max_chars" in m:
        longest = f", {m['max_tokens']} tokens" if "max_tokens" in m else ""
        lines.append(f"longest sample: {m['max_chars']} characters{longest} (a trainer's max_length must hold it)")
    return Output({"out": str(result.out), **m}, lines)


def audit(report: Any) -> Output:
    """audit: the coverage table (also as CSV), the flagged roots, tools, knowledge, cost, the violations."""
    return Output({"runs": report.runs, **report.tables()}, _audit_lines(report), rows_csv(report.coverage))


def _audit_lines(report: Any) -> list[str]:
    lines = [f"audit of {len(report.runs)} run(s): {', '.join(report.runs)}"]
    sections = (
        ("coverage (N_eff/N: how independent the selected paths are)", report.coverage, COVERAGE_COLUMNS),
        (
            "roots outside the learnability band (kept edges always or never improve)",
            report.learnability,
            ["run_id", "tree_id", "stage", "kept_edges", "improved_edges", "band"],
        ),
        ("most frequent tool errors", report.tool_errors, ["run_id", "errors", "share", "message"]),
        ("tool-error rate by tool", report.tool_error_rates, ["run_id", "key", "calls", "errors", "error_rate"]),
        ("knowledge actions", report.knowledge, ["run_id", "area", "access", "actions", "edges"]),
        (
            "improvement with and without knowledge actions",
            report.knowledge_improvement,
            ["run_id", "task", "measure", "with_knowledge", "edges", "improved", "improved_rate"],
        ),
        (
            "cost per task",
            report.cost,
            ["run_id", "task", "roots", "turns", "tokens", "cost", "selected_paths", "tokens_per_selected_path"],
        ),
        (
            "where the turns' time goes (node * is every node; startup: until the first model request)",
            report.time,
            ["run_id", "node", "phase", "turns", "p50_seconds", "p95_seconds", "share"],
        ),
        (
            "preference pairs and labels by recorded rule (pairs at one node share a prompt: "
            "pair_n_eff counts their independent comparisons)",
            report.supervision,
            ["run_id", "selection_id", "task", "stage", "pairs", "fork_points", "pair_n_eff", "good", "bad"],
        ),
    )
    for title, rows, columns in sections:
        lines += [f"\n{title}:", table(rows, columns) if rows else "  (none)"]
    if not report.violations:
        return [*lines, "\naudit: no violations"]
    lines.append(f"\n{len(report.violations)} violation(s):")
    lines += [
        f"  {v['run_id']} {v['kind']} {v['subject']}: {v['problem']}; recorded: {v['recorded'] or '-'}; "
        f"derived: {v['derived'] or '-'}"
        for v in report.violations
    ]
    return lines
