"""Command line: select snapshots, explore, replay, and read the views of a run.

Each command parses its options, makes one library call and renders the result.
stdout carries data only; progress and warnings go to stderr. Errors the project
raises on purpose become ``Error: <message>`` with exit code 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ingest.errors import ProjectError
from ingest.log import DATA_ENV, default_data_dir

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """Turns ProjectError into a clean ``Error: ...`` message and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ProjectError as err:
            raise click.ClickException(str(err)) from err
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option("0.1.0", prog_name="teacher-mcts")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=DATA_ENV,
    default=None,
    help=f"Directory holding runs/ (default ./data, or ${DATA_ENV}).",
)
@click.pass_context
def cli(ctx: click.Context, data_dir: Path | None) -> None:
    """Token-aware MCTS data collection over an event-sourced log."""
    ctx.obj = {"data_dir": data_dir or default_data_dir()}


def _data_dir() -> Path:
    return click.get_current_context().obj["data_dir"]


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, allow_nan=False))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


# ------------------------------------------------------------------ views


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def views(as_json: bool) -> None:
    """List the views of the catalog with what each derives and its grain.

    \b
    Example:
        python cli.py views
    """
    from engine.catalog import read_views

    defs = read_views()
    if as_json:
        _echo_json(
            [
                {"view": v.name, "summary": v.summary, "grain": list(v.grain),
                 "sources": list(v.sources), "notes": v.notes}
                for v in defs.values()
            ]
        )  # fmt: skip
        return
    for v in defs.values():
        click.echo(f"{v.name}\n    {v.summary}\n    grain: {', '.join(v.grain)}")
        click.echo(f"    sources: {', '.join(v.sources)}")


# -------------------------------------------------------- select-snapshots


@cli.command("select-snapshots")
@click.argument("all_snapshots", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--task", required=True, help="Task name recorded with every fact.")
@click.option(
    "--direction",
    type=click.Choice(["maximize", "minimize"]),
    default=None,
    help="Score direction (default: the snapshots' CORAL config, else maximize).",
)
@click.option("--num-roots", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--run-id", default=None, help="Id of the run to record (default: generated).")
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty OUT.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def select_snapshots(
    all_snapshots: Path,
    out: Path,
    task: str,
    direction: str | None,
    num_roots: int,
    run_id: str | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Choose the MCTS roots of a task and copy them to OUT (SPEC §1).

    \b
    Example:
        python cli.py select-snapshots data/student_run/all_snapshots data/out/roots --task demo
    """
    from engine.select import select_snapshots as run

    result = run(
        all_snapshots, out, task, _data_dir(), direction, num_roots, run_id, overwrite
    )
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        _echo_json(
            {
                "run_id": result.run_id, "task": result.task, "direction": result.direction,
                "num_roots": result.num_roots, "out": str(result.out), "stages": result.stages,
                "picks": [
                    {k: p[k] for k in ("snapshot", "global_index", "agent_id", "score", "stage",
                                       "selection_reason")}
                    for p in result.picks
                ],
                "skipped": result.skipped, "warnings": result.warnings,
            }
        )  # fmt: skip
        return
    click.echo(f"run {result.run_id}: task {result.task} ({result.direction}), R={result.num_roots}")
    columns = ["stage", "candidates", "eligible", "quota", "picked_quota", "fills", "picked"]
    click.echo(_table(result.stages, columns))
    total = sum(s["picked"] for s in result.stages)
    click.echo(f"picked {total} snapshots -> {result.out}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped)} folders:")
        for s in result.skipped:
            click.echo(f"  {s['snapshot']}: {s['skip_reason']}")


# ---------------------------------------------------------------- explore


def _explore_overrides(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("backend", "parallel", "schedule", "seed", "direction", "task"):
        if kw.get(key) is not None:
            out[key] = kw[key]
    if kw.get("num_roots") is not None:
        out["selection"] = {"num_roots": kw["num_roots"]}
    return out


@cli.command()
@click.argument("roots", type=click.Path(path_type=Path), required=False)
@click.option("--run-id", default=None, help="Id of the new run (default: generated).")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="Continue an interrupted run from its log.")  # fmt: skip
@click.option("--backend", type=click.Choice(["sim", "opencode"]), default=None,
              help="Teacher backend (default sim).")  # fmt: skip
@click.option("--parallel", type=click.IntRange(min=1), default=None,
              help="Slots shared by all trees (default 4).")  # fmt: skip
@click.option("--schedule", type=click.Choice(["rounds", "async"]), default=None,
              help="rounds (reproducible, default) or async.")  # fmt: skip
@click.option("--seed", type=int, default=None, help="Seed of the run (default 0).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML file with run configuration.")  # fmt: skip
@click.option("--select", "select", is_flag=True,
              help="ROOTS is an all_snapshots dir: select the roots first (needs --task).")  # fmt: skip
@click.option("--task", default=None, help="Task name (default: the ROOTS directory name).")
@click.option("--direction", type=click.Choice(["maximize", "minimize"]), default=None)
@click.option("--num-roots", type=click.IntRange(min=1), default=None,
              help="Roots to select with --select (default 30).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def explore(
    roots: Path | None,
    run_id: str | None,
    resume_id: str | None,
    config_file: Path | None,
    select: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Grow the token-aware MCTS trees of every root (SPEC §2).

    ROOTS is the output of select-snapshots (or, with --select, a task's
    all_snapshots dir). Progress goes to stderr; the summary to stdout.

    \b
    Example:
        python cli.py explore data/out/roots --task kernel-speedup --run-id demo
        python cli.py explore --resume demo
    """
    from engine.config import load_config
    from engine.runs import new_run, resume_run

    if resume_id:
        if roots is not None or run_id or select:
            raise click.UsageError("--resume takes no ROOTS, --run-id or --select")
        result = resume_run(_data_dir(), resume_id)
    else:
        if roots is None:
            raise click.UsageError("ROOTS is required (or --resume RUN_ID)")
        if select and not options.get("task"):
            raise click.UsageError("--select needs --task")
        options["task"] = options.get("task") or roots.resolve().name
        config = load_config(config_file, _explore_overrides(**options))
        result = new_run(_data_dir(), roots, config, run_id, select=select)
    _render_explore(result, as_json)


def _render_explore(result: Any, as_json: bool) -> None:
    if as_json:
        _echo_json({"run_id": result.run_id, "progress": result.progress, "trees": result.trees})
        return
    p = result.progress
    click.echo(
        f"run {result.run_id}: {p['trees_done']}/{p['trees']} trees done; edges kept "
        f"{p['edges_kept']}, kept-exempt {p['edges_kept_exempt']}, pruned {p['edges_pruned']}, "
        f"retried {p['edges_retried']}; leaves {p['leaves']}"
    )
    columns = ["tree_id", "stage", "root_score", "best_score", "kept_edges", "good_leaves",
               "final_leaves", "stop_reason"]  # fmt: skip
    click.echo(_table(result.trees, columns))


if __name__ == "__main__":
    cli()
