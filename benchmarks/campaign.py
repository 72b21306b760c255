"""Benchmark: a campaign's policies at equal budgets - does ``coverage`` buy more independent supervision?

For each seed, a sim campaign of ``--tasks`` tasks over the bundled Student run whose roots
differ in difficulty (each task draws, from the seed, its share of hard roots - more tool
errors, a third of evals failing - and how often the Teacher improves: a task it solves
everywhere, one it rarely can, and the ones between). The ``fixed`` campaign grows every
tree by the task rules (``tree.max_valid_edges``); the ``coverage`` campaign then gets
exactly the valid edges ``fixed`` spent as its budget (with ``--tokens``, a third campaign
gets the tokens ``fixed`` spent instead). Printed per seed and policy, over
the whole campaign: N (selected paths), N_eff (lineage-aware, the audit's), N_eff/N,
N_eff per 1,000 valid edges and per million tokens, stage coverage (the task x stage
cells with a selected path, of those with a root), the N_eff of the least covered such
cell, the rounds and the seconds it took; then the
mean and the spread (min-max) over seeds, the ratios coverage / fixed, and per task
where coverage gained or lost N_eff.

    python benchmarks/campaign.py [--seeds 3] [--tasks 8] [--roots 6] [--max-edges 12] [--tokens] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.campaign.command import new_campaign  # noqa: E402
from engine.collection import Collection  # noqa: E402

SNAPSHOTS = ROOT / "data" / "student_run" / "all_snapshots"
METRICS = """
select
    sum(s.selected_paths) as n,
    sum(s.n_eff) as n_eff,
    sum(p.kept_edges) as edges,
    sum(p.tokens) as tokens
from coverage as s
inner join campaign_spend as p on p.run_id = s.run_id
where s.stratum = 'all'
"""
STAGES = """
select
    count(*) filter (where selected_paths > 0) as covered,
    count(*) filter (where roots > 0) as cells,
    min(coalesce(n_eff, 0)) filter (where roots > 0) as min_cell
from coverage
where stratum = 'stage'
"""
PER_TASK = (
    "select s.run_id, s.stratum_key as task, s.n_eff, s.selected_paths as n from coverage as s where s.stratum = 'task'"
)


def tasks_of(seed: int, count: int) -> list[dict]:
    """``count`` tasks whose difficulty the seed draws: hard roots' share and the Teacher's drift."""
    rng = random.Random(seed)
    drifts = [-0.03, 0.0, 0.01, 0.03, 0.08]  # rarely improves ... improves almost everywhere
    return [
        {
            "name": f"task{i + 1:02d}",
            "seed": seed * 100 + i,
            "hard_share": round(rng.choice([0.0, 0.1, 0.3, 0.6, 0.9]), 2),
            "drift_mean": rng.choice(drifts),
        }
        for i in range(count)
    ]


def campaign_toml(policy: str, tasks: list[dict], roots: int, max_edges: int, budget: dict[str, int]) -> str:
    lines = [f'policy = "{policy}"', "parallel = 8"]
    if budget:
        lines += ["[budget]"] + [f"{unit} = {amount}" for unit, amount in budget.items()]
    lines += [
        "[explore]",
        'backend = "sim"',
        "parallel = 4",
        f"selection = {{ num_roots = {roots} }}",
        f"tree = {{ max_valid_edges = {max_edges} }}",
    ]
    for t in tasks:
        lines += [
            "[[tasks]]",
            f'name = "{t["name"]}"',
            f'source = "{SNAPSHOTS}"',
            f"backend_options = {{ hard_share = {t['hard_share']}, drift_mean = {t['drift_mean']} }}",
            f"explore = {{ seed = {t['seed']} }}",
        ]
    return "\n".join(lines) + "\n"


def measure(data: Path, name: str, path: Path) -> dict:
    start = time.perf_counter()
    result = new_campaign(data, path, name)
    seconds = time.perf_counter() - start
    collection = Collection(data, result.runs)
    m = collection.query(METRICS)[0]
    stages = collection.query(STAGES)[0]
    per_task = {r["task"]: r["n_eff"] or 0.0 for r in collection.query(PER_TASK)}
    n_eff = float(m["n_eff"] or 0.0)
    return {
        "n": int(m["n"]),
        "n_eff": n_eff,
        "ratio": n_eff / m["n"] if m["n"] else 0.0,
        "edges": int(m["edges"]),
        "tokens": int(m["tokens"]),
        "per_k_edges": 1000 * n_eff / m["edges"],
        "per_m_tokens": 1e6 * n_eff / m["tokens"],
        "stage_coverage": stages["covered"] / stages["cells"],
        "min_cell": float(stages["min_cell"]),
        "rounds": result.rounds,
        "seconds": seconds,
        "per_task": per_task,
    }


COLUMNS = [
    ("n", "N", "{:d}"),
    ("n_eff", "N_eff", "{:.1f}"),
    ("ratio", "N_eff/N", "{:.3f}"),
    ("edges", "valid edges", "{:d}"),
    ("tokens", "Mtokens", None),
    ("per_k_edges", "N_eff/1k edges", "{:.1f}"),
    ("per_m_tokens", "N_eff/Mtok", "{:.3f}"),
    ("stage_coverage", "stage cov.", "{:.2f}"),
    ("min_cell", "min cell N_eff", "{:.1f}"),
    ("rounds", "rounds", "{:d}"),
    ("seconds", "s", "{:.0f}"),
]


def cell(key: str, fmt: str | None, value: float) -> str:
    if key == "tokens":
        return f"{value / 1e6:.0f}"
    if fmt == "{:d}" and value != int(value):  # a mean
        return f"{value:.1f}"
    return fmt.format(int(value) if fmt == "{:d}" else value) if fmt else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--roots", type=int, default=6)
    parser.add_argument("--max-edges", type=int, default=12)
    parser.add_argument("--tokens", action="store_true", help="also coverage at fixed's tokens (a token budget)")
    parser.add_argument("--out", type=Path, default=None, help="where the campaigns are kept (default: a temp dir)")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="campaign-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    # coverage at fixed's valid edges, and (--tokens) at fixed's tokens
    variants = {"fixed": "edges", "coverage": "edges"} | ({"coverage-tokens": "tokens"} if args.tokens else {})
    results: dict[str, list[dict]] = {v: [] for v in variants}
    header = "| seed | policy | " + " | ".join(label for _, label, _ in COLUMNS) + " |"
    print(header)
    print("|" + "---|" * (len(COLUMNS) + 2))
    for seed in range(1, args.seeds + 1):
        tasks = tasks_of(seed, args.tasks)
        data = base / f"seed{seed}"
        for policy, unit in variants.items():
            budget = {} if policy == "fixed" else {unit: results["fixed"][-1][unit]}
            path = base / f"seed{seed}-{policy}.toml"
            path.write_text(campaign_toml(policy.split("-")[0], tasks, args.roots, args.max_edges, budget))
            r = measure(data, policy, path) | {"tasks": tasks}
            results[policy].append(r)
            cells = " | ".join(cell(k, f, r[k]) for k, _, f in COLUMNS)
            print(f"| {seed} | {policy} | {cells} |", flush=True)
    print()
    print("| policy | " + " | ".join(label for _, label, _ in COLUMNS[:-2]) + " |")
    print("|" + "---|" * (len(COLUMNS) - 1))
    for policy, runs in results.items():
        cells = []
        for key, _, fmt in COLUMNS[:-2]:
            values = [r[key] for r in runs]
            mean = statistics.mean(values)
            cells.append(f"{cell(key, fmt, mean)} ({cell(key, fmt, min(values))}-{cell(key, fmt, max(values))})")
        print(f"| {policy} | " + " | ".join(cells) + " |")
    print()
    for variant in [v for v in variants if v != "fixed"]:
        for key in ("n_eff", "per_k_edges", "per_m_tokens", "stage_coverage", "min_cell"):
            pairs = zip(results["fixed"], results[variant], strict=True)
            ratios = [c[key] / f[key] for f, c in pairs if f[key]]
            shown = ", ".join(f"{x:.3f}" for x in ratios)
            print(f"{variant} / fixed, {key}: {shown} (mean {statistics.mean(ratios):.3f})")
        print()
        print(f"per task, N_eff fixed -> {variant} (hard_share, drift_mean):")
        for f, c in zip(results["fixed"], results[variant], strict=True):
            parts = [
                f"{t['name']} ({t['hard_share']}, {t['drift_mean']:+.2f}): {f['per_task'][t['name']]:.1f} -> "
                f"{c['per_task'][t['name']]:.1f}"
                for t in f["tasks"]
            ]
            print("  " + "; ".join(parts))
        print()
    (base / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\ncampaigns kept in {base}", file=sys.stderr)


if __name__ == "__main__":
    main()
