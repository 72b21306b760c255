"""The dataset card of an export (``README.md`` beside its files, ``output.CARD``), in Hugging Face's layout.

A YAML header whose ``configs`` name the export's files (so ``datasets.load_dataset(<export
dir>)`` loads them, and not ``manifest.json``), then what a consumer of the files needs to
know and cannot tell from the rows: which runs and tasks, the selection or rule and its
parameters, each task's direction, the counts and how independent they are (N_eff for
paths, pair_n_eff for pairs, by task and stage, as ``audit`` gives them), what exploring
cost, the Teacher's model and runtime, when, the version of this project that recorded
the runs and wrote the files, and the command that writes the same files again.

Every figure is the manifest's (:mod:`engine.export`) or a row of a view it holds
(``run_provenance``, ``coverage``, ``supervision_counts``); this module only lays them out.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from engine import __version__
from engine.catalog import Catalog
from engine.export.features import yaml_features
from engine.export_formats import BY_NAME
from engine.selections import Params, default_params

COVERAGE = (
    "select stratum, stratum_key, selected_paths, n_eff, n_eff_ratio from coverage "
    "where stratum in ('all', 'task', 'stage') order by list_position(['all', 'task', 'stage'], stratum), stratum_key"
)


def provenance(catalog: Catalog) -> dict[str, Any]:
    """The run's row of ``run_provenance`` (times as ISO text, as the manifest holds them)."""
    (row,) = catalog.query("select * exclude (run_id) from run_provenance")
    return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}


def coverage(catalog: Catalog, selection: dict[str, Any]) -> list[dict[str, Any]]:
    """N, N_eff and N_eff/N of a recorded path selection, overall and by task and stage (``coverage``
    evaluated with the selection's parameters: for the run's default selection, the rows ``audit`` shows)."""
    params = Params.of(selection)
    if params == default_params(catalog):  # the state as derived: nothing to evaluate again
        return catalog.query(COVERAGE)
    with catalog.variables.using(**params.variables()):
        return catalog.query(COVERAGE)


def card(manifest: dict[str, Any], shape: tuple, data_dir: Path, options: list[str]) -> str:
    """The card of the export described by ``manifest`` whose rows have the features ``shape``
    (:mod:`engine.export.features`; ``options``: the export's command-line options beyond the runs,
    ``--format`` and ``--out``, as the command that writes the files again needs them)."""
    fmt = manifest["format"]
    runs = manifest["runs"]
    names, written = ", ".join(r["run_id"] for r in runs), BY_NAME[fmt]
    lines = [
        "---",
        f"pretty_name: {json.dumps(f'teacher-mcts {fmt} export of {names}')}",
        "tags:",
        "- teacher-mcts",
        "- agent-trajectories",
        f"- {fmt}",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f'    path: "*.{fmt}.jsonl"',
        "dataset_info:",
        "  features:",
        *yaml_features(shape, 2),
        "---",
        "",
        f"# {manifest['samples']} {written.title} from {len(runs)} teacher-mcts run{'s' if len(runs) != 1 else ''}",
        "",
        written.rows,
        "",
        "Made by exploring saved states (snapshots) of a Student CORAL run with a Teacher agent in token-aware",
        "MCTS trees; every row comes from the runs' event logs (docs/ALGORITHM.md of teacher-mcts). "
        "`manifest.json` holds every figure below as data.",
        "",
        "## Runs",
        "",
        _table(
            ["run", "task", "direction", "Teacher", "model", "Teacher runtime", "recorded by", "started", "finished"],
            [
                [
                    r["run_id"],
                    p["task"],
                    p["direction"],
                    p["backend"],
                    p["model"] or "-",
                    ", ".join(p["teacher_versions"]) or "not recorded",
                    f"teacher-mcts {p['tool_version']}" if p["tool_version"] else "-",
                    p["started_at"] or "-",
                    p["finished_at"] or "not finished",
                ]
                for r in runs
                for p in [r["provenance"]]
            ],
        ),
        "",
        "What exploring cost (every turn of every root, pruned and retried attempts included):",
        "",
        _table(
            ["run", "roots", "turns", "tokens", "cost"],
            [[r["run_id"], *(r["provenance"][k] for k in ("roots", "turns", "tokens", "cost"))] for r in runs],
        ),
        "",
        "## Selection",
        "",
        *_selection(fmt, runs),
        "",
        "## Counts",
        "",
        _filters(manifest),
        "",
        _table(
            ["task", "stage", "samples"],
            [[t, s, n] for t, stages in manifest["counts"].items() for s, n in stages.items()],
        ),
        "",
        *_independence(fmt, runs),
        *_left_out(manifest),
        "## Files",
        "",
        _table(
            ["file", "samples", "bytes", "sha256"],
            [[name, f["samples"], f["bytes"], f["sha256"]] for name, f in sorted(manifest["files"].items())],
        ),
        "",
        "## Reproduce",
        "",
        f"Written by teacher-mcts {__version__}. The same logs (each run's log up to the seq `log_tail` of",
        "`manifest.json`; logs only grow) give byte-identical files, this card and the manifest included, in",
        "a new directory `OUT` (or here, with `--overwrite`):",
        "",
        "```bash",
        _command(data_dir, runs, fmt, options),
        "```",
        "",
    ]
    return "\n".join(lines)


def _selection(fmt: str, runs: list[dict[str, Any]]) -> list[str]:
    if BY_NAME[fmt].of_paths:
        return [
            "The paths of each run's recorded path selection (Top-k per root by PathScore, docs/ALGORITHM.md §3):",
            "",
            _table(
                ["run", "selection", "weights", "top_k"],
                [[r["run_id"], r["selection_id"], json.dumps(r["weights"], sort_keys=True), r["top_k"]] for r in runs],
            ),
        ]
    return [
        "Each run's recorded supervision selection: every finished attempt valued by `rule` (`soft`: its soft "
        "verifier, 0 without a score; `improved`: 1 when it improved on its parent), two attempts of one node "
        "paired when their values differ by at least `min_margin`, an attempt labelled good at `threshold`; "
        "`against_verdict`: whether a pair may prefer an attempt that failed the tree's prune test over one that "
        "passed it (`drop`: never).",
        "",
        _table(
            ["run", "selection", "rule", "min_margin", "threshold", "against_verdict"],
            [
                [r["run_id"], r["selection_id"], r["rule"], r["min_margin"], r["threshold"], r["against_verdict"]]
                for r in runs
            ],
        ),
    ]


def _filters(manifest: dict[str, Any]) -> str:
    kept = " and ".join(f"{k} {v}" for k, v in manifest["filters"].items() if v)
    return f"The rows written, by task and stage (only {kept}):" if kept else "The rows written, by task and stage:"


def _independence(fmt: str, runs: list[dict[str, Any]]) -> list[str]:
    """How independent the rows are: N_eff of the selected paths, pair_n_eff of the pairs (by task and stage)."""
    if BY_NAME[fmt].of_paths:
        rows = [
            [r["run_id"], c["stratum"], c["stratum_key"], c["selected_paths"], c["n_eff"], c["n_eff_ratio"]]
            for r in runs
            for c in r["coverage"]
        ]
        head = (
            "Selected paths share their prefixes: N_eff counts each edge once among the paths through it "
            "(docs/ALGORITHM.md §5; the whole selection, as `audit` gives it for the run's default one):"
        )
        return [head, "", _table(["run", "stratum", "key", "N", "N_eff", "N_eff/N"], rows), ""]
    columns = ["pairs", "against_verdict", "fork_points", "pair_n_eff", "pair_n_eff_ratio", "labelled", "good", "bad"]
    columns += ["step_paths", "steps"]
    rows = [[r["run_id"], c["task"], c["stage"], *(c[k] for k in columns)] for r in runs for c in r["supervision"]]
    head = (
        "Pairs at one node share their prompt and are not independent: pair_n_eff counts, per fork point, the "
        "attempts its pairs involve minus one (the whole selection, by task and stage, as `audit` gives it):"
    )
    return [head, "", _table(["run", "task", "stage", *columns], rows), ""]


def _left_out(manifest: dict[str, Any]) -> list[str]:
    rows = []
    for r in manifest["runs"]:
        left = {k: n for k, n in r.get("left_out", {}).items() if n}
        if r.get("invalid_call_samples"):
            left["with a call of a tool not offered"] = r["invalid_call_samples"]
        rows += [[r["run_id"], k, n] for k, n in left.items()]
    if not rows:
        return []
    return ["Left out or flagged (manifest.json, `left_out`):", "", _table(["run", "what", "rows"], rows), ""]


def _command(data_dir: Path, runs: list[dict[str, Any]], fmt: str, options: list[str]) -> str:
    words = ["teacher-mcts", "--data", str(Path(data_dir).absolute()), "export", *(r["run_id"] for r in runs)]
    words += ["--format", fmt, *options]
    return " ".join(shlex.quote(w) for w in words) + " --out OUT"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    if not rows:
        return "(none)"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")
