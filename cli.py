"""Command line: select snapshots, explore and run campaigns, replay, read, serve and export runs, verify logs.

Each command parses its options, makes one library call and prints its result: most through ``show`` (text,
``--json`` or ``--csv``; what each result prints is in engine/outputs/, the terminal's layout in
engine/render.py), ``sql`` its rows as they stream, ``watch`` its frames; ``report``, ``bundle`` and ``serve``
write files or serve pages. What the commands share (the group, the option groups as decorators, the option
checks, the command's one reader of derived state) is in engine/commandline.py. stdout carries data only,
progress and warnings stderr; an error the project raises is ``Error: <message>``, exit 1, never a traceback.
The algorithm: docs/ALGORITHM.md. A new command: a ``@cli.command()`` function reading through ``reader()``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from engine import __version__
from engine.commandline import (
    AGAINST_VERDICT_HELP,
    CONTEXT_SETTINGS,
    COUNT,
    DATA_HELP,
    DATA_TYPE,
    EXPLORE_DIRECTION_HELP,
    INT64,
    MAX_TURN_TIMEOUT_S,
    FiniteFloat,
    Group,
    data_dir,
    executor_options,
    name_damaged,
    output,
    parallel_checked,
    reader,
    run_id_checked,
    show,
    show_replayed_collection,
    strata_checked,
    token_options,
    workspace_checked,
)
from engine.export_formats import FORMATS
from engine.process import run_to_exit
from ingest.paths import DATA_ENV, default_data_dir
from ingest.snapshots import STAGES


@click.group(cls=Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="teacher-mcts")
@click.option("--data", "data_dir", type=DATA_TYPE, envvar=DATA_ENV, default=None, help=DATA_HELP)
@click.pass_context
def cli(ctx: click.Context, data_dir: Path | None) -> None:
    """Token-aware MCTS data collection over an event-sourced log."""
    ctx.obj = {"data_dir": data_dir or default_data_dir()}


# ------------------------------------------------------------------ views


@cli.command()
@output()
def views(fmt: str) -> None:
    """List the views of the catalog with what each derives, its grain and its sources.

    \b
    Example:
        python cli.py views
    """

    from engine import outputs
    from engine.catalog import read_views

    show(outputs.views(read_views()), fmt)


# -------------------------------------------------------- select-snapshots


@cli.command("select-snapshots")
@click.argument("all_snapshots", metavar="SOURCE", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--task", required=True, help="Task name recorded with every fact and in the copies.")
@click.option(
    "--direction",
    type=click.Choice(["maximize", "minimize"]),
    default=None,
    help="Score direction (default: the one the snapshots record, else their CORAL config, else maximize).",
)
@click.option("--num-roots", type=COUNT, default=30, show_default=True)
@click.option("--run-id", default=None, callback=run_id_checked, help="Id of the run to record (default: generated).")
@click.option(
    "--overwrite", is_flag=True, help="Replace an earlier output in OUT (only snapshot folders are replaced)."
)
@output()
def select_snapshots(
    all_snapshots: Path,
    out: Path,
    task: str,
    direction: str | None,
    num_roots: int,
    run_id: str | None,
    overwrite: bool,
    fmt: str,
) -> None:
    """Choose the MCTS roots of a task and copy them to OUT (docs/ALGORITHM.md, "Roots").

    SOURCE is a task's all_snapshots dir, or a CORAL run directory (every attempt
    in its .coral/public/attempts is a candidate; the picks are written out as
    snapshot folders). Every candidate is staged early, middle or late by how far
    its score got along the run's learning curve; the roots are spread over the
    stages by quota. The copies' metadata.json gain score, stage,
    selection_reason, task and direction, which explore reads.

    \b
    Example:
        python cli.py select-snapshots data/student_run/all_snapshots data/out/roots --task demo
        python cli.py select-snapshots results/speedup/latest data/out/speedup --task speedup
    """

    from engine import outputs
    from engine.roots import select_snapshots as run

    options = {"direction": direction, "num_roots": num_roots, "run_id": run_id, "overwrite": overwrite}
    result = run(all_snapshots, out, task, data_dir(), **options)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    show(outputs.selection(result), fmt)


# ---------------------------------------------------------------- explore


@cli.command()
@click.argument("roots", type=click.Path(path_type=Path), required=False)
@click.option("--run-id", default=None, callback=run_id_checked, help="Id of the new run (default: generated).")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID", help="Continue an interrupted run from its log.")
@click.option("--backend", type=click.Choice(["sim", "opencode"]), default=None, help="Teacher backend (default sim).")
@click.option(
    "--parallel",
    type=click.IntRange(min=1),
    default=None,
    callback=parallel_checked,
    help="Teacher slots shared by all trees (default 4; at most 4096, or half of ulimit -u).",
)
@click.option(
    "--schedule",
    type=click.Choice(["rounds", "async"]),
    default=None,
    help="rounds: batches, reproducible (default for sim); async: a free slot is refilled "
    "at once (default for opencode).",
)
@click.option("--seed", type=INT64, default=None, help="Seed of the run (default 0).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML file with run configuration.",
)
@click.option(
    "--select",
    "select",
    is_flag=True,
    help="ROOTS is an all_snapshots dir or CORAL run: select the roots first (needs --task).",
)
@click.option(
    "--task", default=None, help="Task name (default: the one the roots were selected for; needed with --select)."
)
@click.option("--direction", type=click.Choice(["maximize", "minimize"]), default=None, help=EXPLORE_DIRECTION_HELP)
@click.option(
    "--num-roots",
    type=COUNT,
    default=None,
    help="Roots to select with --select (default 30).",
)
@click.option("--model", default=None, help="opencode: provider/model.")
@click.option("--endpoint", default=None, help="opencode: OpenAI-compatible base URL (.../v1).")
@click.option("--api-key-env", default=None, help="opencode: variable holding the API key.")
@click.option("--eval-command", default=None, help='opencode: eval command (default "coral eval -m").')
@click.option(
    "--turn-timeout",
    type=FiniteFloat(min=0, min_open=True, max=MAX_TURN_TIMEOUT_S),
    default=None,
    help="opencode: seconds of a turn's work, from its first model request (at most a week).",
)
@click.option("--worktrees", default=None, help="opencode: where worktrees go (default: in the run).")
@click.option(
    "--coral-dir",
    default=None,
    help="opencode: the Student run's .coral; every edge gets a CORAL run of its own, graded by "
    "CORAL's daemon (the Student run is only read).",
)
@click.option(
    "--no-grader-check",
    is_flag=True,
    default=None,
    help="opencode with --coral-dir: do not grade a root's own code before the first turn.",
)
@executor_options("With --executor ray: the cluster to join (default $RAY_ADDRESS, else a local one).")
@output()
def explore(
    roots: Path | None,
    run_id: str | None,
    resume_id: str | None,
    config_file: Path | None,
    fmt: str,
    **options: Any,
) -> None:
    """Grow the token-aware MCTS trees of every root (docs/ALGORITHM.md, "Trees").

    ROOTS is the output of select-snapshots (or, with --select, a task's
    all_snapshots dir or CORAL run). Progress goes to stderr; the summary to stdout: per tree
    its kept edges (kept_exempt ones included), leaves, stop, and its paths:
    candidate root-to-leaf paths, ranked (every node has a score and every edge a
    knowledge value, so the path can be ranked), selected (in the Top-k).

    With --backend opencode and --coral-dir (the Student run's .coral), every
    edge gets a CORAL run of its own and CORAL's grader daemon runs beside each
    turn, so that CORAL's coral eval grades in the edge's worktree.

    \b
    Example:
        python cli.py explore data/out/roots --run-id demo
        python cli.py explore --resume demo
        python cli.py explore data/out/speedup --backend opencode --model sglang/qwen \\
            --endpoint http://127.0.0.1:30000/v1 --coral-dir results/speedup/latest/.coral
        python cli.py explore data/out/roots --run-id big --executor ray --ray-address auto
    """

    from engine import outputs
    from engine.explore_options import explore_from_command_line
    from engine.render import ProgressLine

    progress, echo = ProgressLine(), functools.partial(click.echo, err=True)
    try:
        result = explore_from_command_line(
            data_dir(), roots, run_id, resume_id, config_file, options, progress=progress, echo=echo
        )
    finally:
        progress.close()
    show(outputs.exploration(result, data_dir()), fmt)


@cli.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--name", default=None, callback=run_id_checked, help="Name of the campaign (default: the file's stem).")
@click.option("--resume", "resume_name", default=None, metavar="NAME", help="Continue an interrupted campaign.")
@click.option(
    "--parallel", type=click.IntRange(min=1), callback=parallel_checked, help="Turns at once, over all tasks."
)
@executor_options("With --executor ray: the cluster to join (default: a local one).")
@output()
def campaign(campaign_file: Path | None, name: str | None, resume_name: str | None, fmt: str, **options: Any) -> None:
    """Explore many tasks under one budget (CAMPAIGN_FILE: docs/CAMPAIGNS.md); each task is a run, NAME-TASK.

    Policy fixed: every tree by its task's rules; coverage: each block where it adds the most N_eff per token.

    \b
    Example:
        python cli.py campaign campaign.toml && python cli.py audit campaign
    """
    from engine import outputs
    from engine.campaign.command import from_command_line

    if bool(resume_name) == (campaign_file is not None or bool(name)):
        raise click.UsageError("give CAMPAIGN_FILE (and --name), or --resume NAME")
    result = from_command_line(data_dir(), campaign_file, name, resume_name, **options)
    show(outputs.campaign(result, data_dir()), fmt)


# ------------------------------------------------------------ replay, paths


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option("--tree", "tree_id", default=None, help="Draw this tree of the one run named (with --json: its lines).")
@output()
def replay(run_ids: tuple[str, ...], tree_id: str | None, fmt: str) -> None:
    """Rebuild every tree from the log and re-derive every recorded decision.

    One run: its trees, the differences and a count. Several runs (default: every
    run under --data): a line per run as it is checked, the differences, a total.
    A campaign's name: its rounds' grants re-derived from its runs' logs, then each
    of its runs. Exit code 1 when any recorded decision differs from what the log
    prefix it saw implies; each difference is listed.

    \b
    Example:
        python cli.py replay demo
        python cli.py replay demo --tree T003
        python cli.py --data /data/collection replay
    """

    from engine import outputs
    from engine.replay import replay_run
    from engine.runset import is_campaign
    from engine.trees import tree_lines, tree_rows
    from ingest.text import sql_text

    if len(run_ids) != 1:
        if tree_id:
            raise click.UsageError("--tree draws a tree of one run: name exactly one RUN_ID")
        return show_replayed_collection(list(run_ids), fmt)
    if is_campaign(data_dir(), run_ids[0]) and not tree_id:
        from engine.campaign.replay import replay_campaign

        shown = outputs.replayed_campaign(replay_campaign(data_dir(), run_ids[0]))
        show(shown, fmt)
        sys.exit(1 if shown.document["differ"] else 0)
    result = replay_run(data_dir(), run_ids[0])
    drawn = tree_rows(result.catalog.query, f"tree_id = {sql_text(tree_id)}").get(tree_id) if tree_id else None
    if tree_id and drawn is None:  # before any output: the report is whole or not printed
        raise click.ClickException(f"run {run_ids[0]!r} has no tree {tree_id!r}")
    show(outputs.replay(result, tree_id, tree_lines(drawn) if drawn else []), fmt)
    if result.differences:
        sys.exit(1)


@cli.command()
@click.argument("run_id")
@click.option("--tree", "tree_id", default=None, help="Only this tree.")
@click.option(
    "--selection", "selection", default=None, help="A recorded selection id (default: the run's default selection)."
)
@output(csv="Print CSV.")
def paths(run_id: str, tree_id: str | None, selection: str | None, fmt: str) -> None:
    """Print the selected root-to-leaf paths of a run with their fields (docs/ALGORITHM.md, "Paths").

    A path is ranked when every node on it has a score and every edge a knowledge
    value; the Top-k ranked paths of each root by PathScore are selected.

    \b
    Example:
        python cli.py paths demo --tree T001
        python cli.py paths demo --csv > paths.csv
    """

    from engine import outputs
    from engine.selections import selected_paths

    show(outputs.paths(*selected_paths(reader(), run_id, selection, tree_id)), fmt)


@cli.command()
@click.argument("run_id")
@click.option(
    "--weights",
    default=None,
    metavar="max=W,avg=W,clean=W,know=W",
    help="PathScore weights (missing keys keep the run's; each within +-1e6, not all 0).",
)
@click.option("--top-k", type=COUNT, default=None, help="Paths per root (default: the run's).")
@click.option(
    "--diversity",
    "diversity",
    type=FiniteFloat(min=0, max=1e6),
    default=None,
    metavar="LAMBDA",
    help="Pick each root's paths greedily by PathScore + LAMBDA x the N_eff each adds (0 to 1e6).",
)
@click.option("--rule", type=click.Choice(["soft", "improved"]), help="Record pairs and labels by this value instead.")
@click.option("--min-margin", type=FiniteFloat(min=0, max=1), help="With --rule: a pair's least margin (0 to 1].")
@click.option("--threshold", type=FiniteFloat(min=0, max=1), help="With --rule: a good label's least value (0 to 1].")
@click.option("--against-verdict", type=click.Choice(["drop", "keep"]), help=AGAINST_VERDICT_HELP)
@output()
def reselect(
    run_id: str,
    weights: str | None,
    top_k: int | None,
    diversity: float | None,
    rule: str | None,
    min_margin: float | None,
    threshold: float | None,
    against_verdict: str | None,
    fmt: str,
) -> None:
    """Select paths again with other weights, k or diversity, from the same log (no rollout re-run).

    The selection is appended as a decision whose id follows from its parameters;
    the same parameters again append nothing. With --diversity the Top-k of each
    root are picked one by one, each time the path with the highest PathScore plus
    LAMBDA times the lineage-aware count it adds to those already picked
    (docs/ALGORITHM.md, "Paths"); per root and overall, N_eff/N and the mean
    PathScore are shown beside the default selection's.

    \b
    Example:
        python cli.py reselect demo --weights max=0.5,avg=0.2,clean=0.15,know=0.15 --top-k 4
        python cli.py reselect demo --diversity 0.5
        python cli.py reselect demo --rule improved --min-margin 1 --threshold 1

    With --rule (--min-margin, --threshold, --against-verdict) it records the preference
    pairs, labels and step labels of the run's attempts under that rule instead (export
    --format dpo|kto|steps --selection ID writes them; docs/ALGORITHM.md, "Paths").
    """

    from engine import outputs

    if rule is None and (min_margin is not None or threshold is not None or against_verdict is not None):
        raise click.UsageError("--min-margin, --threshold and --against-verdict go with --rule")
    if rule is not None:
        if weights is not None or top_k is not None or diversity is not None:
            raise click.UsageError(
                "--rule records pairs and labels: it does not go with --weights, --top-k or --diversity"
            )
        from engine.supervision import reselect_supervision

        chosen = reselect_supervision(data_dir(), run_id, rule, min_margin, threshold, against_verdict)
        return show(outputs.supervision(chosen), fmt)
    from engine.selections import reselect as run

    show(outputs.reselection(run(data_dir(), run_id, weights, top_k, diversity)), fmt)


# ------------------------------------------------------------------ watch


@cli.command()
@click.argument("run_id")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--period",
    type=FiniteFloat(min=0.2, max=3600),
    default=5.0,
    show_default=True,
    help="Seconds between looks at the log when no new part is noticed.",
)
def watch(run_id: str, once: bool, period: float) -> None:
    """Watch a run (a campaign: its rounds and a line per run) as another process writes it, to its end.

    Trees done and active and why they stopped, edges by verdict, leaves, each tree's
    best score against its root's, the turns in flight and for how long, tool-error
    and knowledge-action rates, edges and tokens per hour and the time left. Only
    whole log parts are read, so every frame is a consistent prefix of the run. On a
    terminal narrower than 100 columns, or a pipe, it prints a line per change.

    \b
    Example:
        python cli.py watch demo
        python cli.py watch demo --once
    """

    from engine.render import show_campaign_frames, show_frames
    from engine.runset import is_campaign
    from engine.watch import follow

    if is_campaign(data_dir(), run_id):  # a campaign's rounds and budget, a line per task's run
        from engine.campaign.watch import follow_campaign

        return show_campaign_frames(follow_campaign(reader(), run_id, period), once, click.echo)
    show_frames(follow(reader(), run_id, period), once, click.echo)


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option(
    "--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The HTML file to write."
)
def report(run_ids: tuple[str, ...], out: Path) -> None:
    """Write one self-contained HTML report of runs (default: every run under --data).

    Every tree drawn (nodes coloured by score against the root, verdicts, leaf
    reasons, the selected paths; hover or click for the details), the stage coverage
    of roots and selected paths, N_eff/N and the N_eff(N) curve, tool-error and
    knowledge-action rates, tokens and cost per root; for several runs, an overview
    first. The file needs nothing from the network to open.

    \b
    Example:
        python cli.py report demo --out report.html
    """

    from engine.collection import open_runs
    from engine.report import write_report
    from ingest.paths import outside_data

    outside_data(out, data_dir(), "the report")
    runs = open_runs(data_dir(), list(run_ids) or None)
    size = write_report(runs, out)
    click.echo(f"wrote {out} ({size / 1024:,.0f} KiB)", err=True)
    name_damaged(runs.damaged)


@cli.command()
@click.argument("names", nargs=-1, metavar="[RUN_OR_CAMPAIGN ...]")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write (new or a bundle).")
def bundle(names: tuple[str, ...], out: Path) -> None:
    """Write a static bundle of runs (default: every run under --data) that opens from disk, with no server.

    The pages `serve` draws: each run, its trees, every path's conversation (selected or not), the attempts
    a tree compares; links are relative files, pages not in it (search, SQL) marked. Written whole or not at all.

    \b
    Example:
        python cli.py bundle demo --out demo-bundle && chromium demo-bundle/index.html
    """
    from engine.web.bundle import write_bundle

    written = write_bundle(data_dir(), list(names), out)
    click.echo(written.summary(), err=True)
    name_damaged(written.damaged)


@cli.command()
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (every request needs its token).")
@token_options
def serve(port: int, host: str, token: str | None, new_token: bool) -> None:
    """Serve a local web app over the runs under --data, live while they are written.

    The collection and its audit, each run (its trees as `report` draws them, updated as parts land), each
    tree's nodes and turns, every path's conversation (selected or not), failures marked, and the read-only SQL
    of `sql`. No page changes a run; nothing is fetched from the network. Every request needs the token printed
    at start (every page is under the address printed); it lasts across restarts (saved links keep working):
    kept owner-only (0600) in ~/.config/teacher-mcts/serve-tokens/ per data directory, never in it.

    \b
    Example:
        python cli.py serve --port 8000
    """
    from engine.web import serve as serve_app

    serve_app(data_dir(), host, port, token, new_token)


# ------------------------------------------------------------ sql, audit


@cli.command("sql")
@click.argument("args", nargs=-1, metavar="[RUN_ID ...] QUERY")
@output(csv="Print CSV.")
@click.option(
    "--parquet",
    "parquet",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the result to this Parquet file instead (never among the runs of --data).",
)
@click.option("--overwrite", is_flag=True, help="With --parquet: replace an existing file.")
@click.option(
    "--memory-limit",
    "memory_limit",
    default=None,
    metavar="SIZE",
    help="Memory the query may take (default 4GB, or $TEACHER_MCTS_SQL_MEMORY).",
)
@click.option(
    "--timeout",
    "timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Seconds the query and its output may take (default 300, or $TEACHER_MCTS_SQL_TIMEOUT_S).",
)
def sql_command(
    args: tuple[str, ...],
    fmt: str,
    parquet: Path | None,
    overwrite: bool,
    memory_limit: str | None,
    timeout: float | None,
) -> None:
    """Run a read-only SQL query over the views of runs (default: every run under --data).

    Every view is the union of the runs' rows, run_id first (`python cli.py views` lists
    them). Only a query is run: one SELECT (or EXPLAIN of one) - statements that write,
    attach, install, load or set, EXPLAIN ANALYZE, and reads of files outside the runs'
    logs are refused and nothing is run or written. A query past its memory or time limit (its
    output included) is stopped: nothing is printed. Without RUN_IDs, a damaged run is left out and named (exit 1).

    \b
    Example:
        python cli.py sql "select run_id, stratum_key as stage, n_eff_ratio from coverage where stratum = 'stage'"
        python cli.py sql demo "select * from edges where verdict = 'pruned'" --csv > pruned.csv
    """

    from engine.catalog.queries import check_query
    from engine.collection import Limits, open_runs, parquet_target, write_parquet
    from engine.render import print_rows

    if parquet is not None and fmt != "text":
        raise click.UsageError("--json, --csv and --parquet go one at a time")
    if overwrite and parquet is None:
        raise click.UsageError("--overwrite goes with --parquet")
    if not args:
        raise click.UsageError("QUERY is required")
    runs, query, limits = list(args[:-1]), args[-1], Limits.resolve(memory_limit, timeout)
    checked = check_query(query)  # refused before any run is read (and parsed once)
    if parquet is not None:
        parquet_target(parquet, data_dir(), overwrite)
    collection = open_runs(data_dir(), runs or None, limits)
    with collection.result(checked) as result:  # its time limit covers formatting and writing
        if parquet is None:
            print_rows(fmt, sys.stdout, result)
        else:
            rows = write_parquet(result.record_batches(), parquet, data_dir(), overwrite)
            click.echo(f"wrote {rows} rows to {parquet}", err=True)
    name_damaged(collection.damaged)


@cli.command("audit")
@click.argument("run_ids", nargs=-1)
@click.option(
    "--by",
    "by",
    default="task,stage",
    callback=strata_checked,
    show_default=True,
    help="Strata of the coverage table: any of task, stage, depth, lineage, root.",
)
@output(csv="Print the coverage table as CSV.")
def audit_command(run_ids: tuple[str, ...], by: tuple[str, ...], fmt: str) -> None:
    """Audit runs (default: every run under --data): coverage, N_eff/N, learnability, tools, cost.

    The coverage table gives per stratum the roots, candidate, ranked and selected
    paths, edges by verdict and N_eff/N, the selected paths' independent share
    (docs/ALGORITHM.md, "Coverage"). Roots whose kept edges always or never improve
    are flagged. Exit 1 when any audit_* view has rows: each is listed.

    \b
    Example:
        python cli.py audit demo --by task,stage,depth
    """

    from engine import outputs
    from engine.audit import audit

    report = audit(data_dir(), list(run_ids) or None, by)
    show(outputs.audit(report), fmt)
    name_damaged(report.damaged)
    if report.violations:
        sys.exit(1)


@cli.command("export")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID ...]")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write (new or empty).")
@click.option("--selection", default=None, help="A recorded selection id (default: each run's default one).")
@click.option(
    "--format",
    "sample_format",
    type=click.Choice(FORMATS),
    default="chat",
    show_default=True,
    help="chat: OpenAI messages, tools (SFT); atif: ATIF v1.4; dpo: pairs; kto: labelled attempts; steps: edges.",
)
@click.option("--task", default=None, help="Only paths of this task.")
@click.option(
    "--stage",
    type=click.Choice(STAGES),
    default=None,
    help="Only paths whose root is of this stage.",
)
@click.option(
    "--workspace",
    default="/workspace",
    show_default=True,
    callback=workspace_checked,
    help="The path that replaces every worktree directory in the samples.",
)
@click.option("--no-reasoning", "no_reasoning", is_flag=True, help="Leave out the model's reasoning text.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out.")
@click.option(
    "--invalid-calls",
    "invalid",
    type=click.Choice(["keep", "drop"]),
    default="keep",
    show_default=True,
    help="Keep or leave out the samples holding a call of a tool the model was not offered "
    "(OpenCode re-sends it as a call of 'invalid'; metadata.invalid_calls marks them).",
)
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="A local Hugging Face tokenizer directory: the manifest gives each sample's tokens "
    "as its chat template renders it (needs the train extra).",
)
@output()
def export(
    run_ids: tuple[str, ...],
    out: Path,
    selection: str | None,
    sample_format: str,
    task: str | None,
    stage: str | None,
    workspace: str,
    no_reasoning: bool,
    overwrite: bool,
    invalid: str,
    tokenizer: str | None,
    fmt: str,
) -> None:
    """Export the selected paths of runs as a training set: one sample per path.

    Each sample is the conversation the model had along the path, root to leaf
    (system prompt, each turn's prompt, its messages, tool calls and results), with
    the path's fields, its nodes' scores and tokens and its turns' eval results.
    Without RUN_IDs, every run with a path selection. One JSONL file per run, and
    manifest.json (selection, weights, log tails, counts, sha256 of each file).
    dpo, kto and steps write a recorded supervision selection (reselect --rule) in
    TRL's preference, unpaired and stepwise formats (docs/TRAINING.md).

    \b
    Example:
        python cli.py export demo --out data/out/train
        python cli.py export demo --format atif --stage late --out data/out/late-atif
        python cli.py export demo --format dpo --out data/out/pairs
    """

    from engine import outputs
    from engine.export import export_runs

    result = export_runs(
        reader(),
        list(run_ids),
        out,
        selection=selection,
        fmt=sample_format,
        task=task,
        stage=stage,
        workspace=workspace,
        reasoning=not no_reasoning,
        overwrite=overwrite,
        invalid=invalid,
        tokenizer=tokenizer,
    )
    show(outputs.export(result, invalid), fmt)
    name_damaged(result.damaged)


# ------------------------------------------------------- verify, quarantine


@cli.command()
@click.argument("run_id")
@output()
def verify(run_id: str, fmt: str) -> None:
    """Read every byte of every part of a run's log (or a campaign's logs) and report the first damaged one.

    The run's record of its parts must be whole; each part it names must match the
    checksum its name records, have a footer that agrees with the log, decode page
    by page, hold exactly the seqs its name says and only this run's events; the
    parts must cover 1..tail without a gap; no other file may lie in log/ (a file
    copied in is listed as FOREIGN: nothing reads it). Exit 1 when anything is
    wrong: the report names the part or file, its seq range and the intact prefix.
    A campaign's name: its own log, then each of its runs', a section each. Nothing is changed.

    \b
    Example:
        python cli.py verify demo
    """

    from engine import outputs
    from engine.campaign.integrity import derived_states, verify_named

    found = verify_named(data_dir(), run_id)  # a run's log, or a campaign's: its own and each of its runs'
    show(outputs.verified(found, data_dir(), derived_states(reader(), found)), fmt)
    if not found.ok:
        sys.exit(1)


@cli.command()
@click.argument("run_id")
@click.argument("part")
@output()
def quarantine(run_id: str, part: str, fmt: str) -> None:
    """Move the first damaged part of a run's log, and every part after it, aside (never deleting).

    PART is the part `verify` names (its file name or path), or a FOREIGN file it lists
    (moved alone; the log is unchanged); any other part is refused. The parts and the
    run's spool of finished turns go to <run>/quarantine/. What is left is the intact
    prefix, a state the run really had: replay, paths and sql read it, and an exploration
    continues from it with `explore --resume`, which runs again the turns the moved events
    recorded. A campaign's name: PART is moved in whichever of its logs names it.

    \b
    Example:
        python cli.py verify demo
        python cli.py quarantine demo part-000000000484-000000001037-L1-0f1245d5fa0aba4904b06b91c43bb35a.parquet
    """

    from engine import outputs
    from engine.campaign.integrity import quarantine_named

    done, what = quarantine_named(data_dir(), run_id, part)  # a campaign's name: in the log of it naming PART
    show(outputs.quarantined(done, done.run_id, data_dir(), what), fmt)


def main() -> NoReturn:
    """Run the command line and end the process (``engine.process.run_to_exit``: no interpreter teardown)."""
    run_to_exit(cli)


if __name__ == "__main__":
    main()
