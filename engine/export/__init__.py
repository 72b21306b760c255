"""The training set: runs' recorded selections exported as training samples (``export``).

``chat`` and ``atif``: one sample per path of a recorded path selection (the run's default
one, or the one named) - the conversation the model had along the path, root to leaf, with
the path's fields, its nodes' scores and tokens and its turns' eval results; ``dpo``, ``kto``,
``steps``: a supervision selection's pairs, labelled attempts and step labels. Each export
writes a manifest and a dataset card beside its files. The rooms: ``conversations`` (a
path's conversation from its turns' recorded ones, read from the log; ``candidates``: any
path's, for the viewer), ``formats`` (chat and ATIF v1.4 samples), ``supervised`` (the
other three), ``output`` (the files, streamed, hashed, moved into place whole), ``card`` and
``features`` (the dataset card), ``training`` (a chat template and trainers that score the
assistant's tokens only).

Which rows, in which order, and which turns make them come from the views
(``int_paths__recorded``, ``int_path_turns``, ``pairs``, ``labels``, ``steps``); an export is a
function of the logs and its options: the same logs and selection give byte-identical files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import Catalog
from engine.config import recorded_config
from engine.export.card import card, coverage, provenance
from engine.export.conversations import (
    Contents,
    PathConversation,
    Placeholder,
    TurnConversations,
    invalid_calls,
    join_turns,
    read_conversations,
)
from engine.export.formats import Lengths, atif_trajectory, chat_sample
from engine.export.output import MADE_BY, ExportDir
from engine.export.supervised import (
    SupervisedRun,
    Written,
    prepare_supervised,
    supervised_samples,
)
from engine.export_formats import BY_NAME, FORMATS
from engine.runs import in_order
from engine.runset import DamagedRun, Reader
from engine.selections import recorded_selection
from ingest.errors import InputError, LogError, OutputError, os_problem
from ingest.log import EventLog
from ingest.paths import outside_data

INVALID_CALLS = ("keep", "drop")
DEFAULT_WORKSPACE = "/workspace"
PATH_FIELDS = (
    "rank",
    "path_score",
    "max_score",
    "max_score_rank",
    "avg_score",
    "avg_score_rank",
    "avg_cleanliness",
    "avg_knowledge",
)
TURN_FIELDS = (
    "node_id",
    "edge_id",
    "turn",
    "score",
    "eval_status",
    "outcome",
    "steps",
    "tool_calls",
    "tool_errors",
    "context_tokens",
)


@dataclass
class ExportResult:
    """What ``export`` wrote: the directory and its manifest."""

    out: Path
    manifest: dict[str, Any]
    damaged: list[DamagedRun] = field(default_factory=list)  # runs under data_dir left out (no run named)


def export_runs(
    reader: Reader,
    run_ids: list[str],
    out: Path,
    *,
    selection: str | None = None,
    fmt: str = "chat",
    task: str | None = None,
    stage: str | None = None,
    workspace: str = DEFAULT_WORKSPACE,
    reasoning: bool = True,
    overwrite: bool = False,
    invalid: str = "keep",
    tokenizer: str | None = None,
) -> ExportResult:
    """Export the selected paths of ``run_ids`` (when none: every run holding a selection but the
    damaged ones, named in the result's ``damaged``) to ``out``.

    Runs are exported one after another, one file each (``<run>.<format>.jsonl``),
    then ``manifest.json``. What a run's samples are made of (its paths, their turns'
    conversations) is read while the run before is written (:func:`~engine.runs.in_order`:
    a run per core at once, so at most that many runs' conversations are held). Any
    error leaves ``out`` as it was. ``invalid``: keep or drop the samples with a call
    of a tool the model was not offered; ``tokenizer``: a local Hugging Face tokenizer
    directory whose chat template counts each sample's tokens for the manifest.
    """
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if invalid not in INVALID_CALLS:
        raise InputError(f"--invalid-calls must be one of {', '.join(INVALID_CALLS)}, not {invalid!r}")
    supervised = not BY_NAME[fmt].of_paths
    if supervised and tokenizer:
        raise InputError(f"--tokenizer counts the tokens of chat and atif samples, not of {fmt} ones")
    lengths = Lengths(tokenizer)
    if not workspace.startswith("/") or len(workspace) < 2:
        raise InputError(f"--workspace must be an absolute directory path, not {workspace!r}")
    data_dir = reader.data_dir
    found = reader.runs(run_ids or None).checked()
    runs, damaged = found.run_ids, found.damaged
    if not run_ids:
        runs = _runs_with_selections(data_dir, runs, BY_NAME[fmt].decision)
    target = ExportDir(outside_data(Path(out), data_dir, "the export"), overwrite)
    try:

        def prepare(log: EventLog) -> _RunExport | SupervisedRun:
            with reader.open(log.run_id) as catalog:
                if supervised:
                    run = prepare_supervised(log, catalog, selection, fmt, task=task, stage=stage, workspace=workspace)
                else:
                    run = _prepare_run(log, catalog, selection, fmt, task, stage, workspace)
                run.provenance = provenance(catalog)
                if not supervised:  # (last: another selection's weights make the path tables stale)
                    run.coverage = coverage(catalog, run.chosen)
                return run

        records = [
            _write_supervised(target, run, fmt, workspace, reasoning, invalid)
            if supervised
            else _write_run(target, run, fmt, workspace, reasoning, invalid, lengths)
            for run in in_order([EventLog(data_dir, r) for r in runs], prepare)
        ]
        if not any(r["samples"] for r in records):
            _nothing_written(records, runs, fmt, task, stage)
        manifest = _manifest(records, target.files, fmt, selection, task, stage, workspace, reasoning, invalid, lengths)
        options = [
            *(["--selection", selection] if selection else []),
            *(["--task", task] if task else []),
            *(["--stage", stage] if stage else []),
            *(["--workspace", workspace] if workspace != DEFAULT_WORKSPACE else []),
            *([] if reasoning else ["--no-reasoning"]),
            *(["--invalid-calls", invalid] if invalid != "keep" else []),
            *(["--tokenizer", tokenizer] if tokenizer else []),
        ]
        text = card(manifest, target.shapes.shape(), data_dir, options)
        return ExportResult(target.commit(manifest, text), manifest, damaged)
    except OSError as err:
        target.abandon()
        raise OutputError(f"{target.out}: cannot write the export ({os_problem(err)}); nothing was written") from err
    except BaseException:
        target.abandon()
        raise


def _runs_with_selections(data_dir: Path, run_ids: list[str], kind: str) -> list[str]:
    runs_dir = Path(data_dir) / "runs"
    found = [run_id for run_id in run_ids if any(EventLog(data_dir, run_id).scan_kind(kind, ["seq"]))]
    if not found:
        what = "a supervision selection" if kind == "supervision_selected" else "a path selection"
        raise InputError(f"no run under {runs_dir} has {what} - give the RUN_IDs to export")
    return found


def _nothing_written(records: list[dict[str, Any]], runs: list[str], fmt: str, task: str | None, stage: str | None):
    """InputError: no sample was written, and why."""
    wanted = " and ".join(f"{k} {v!r}" for k, v in (("task", task), ("stage", stage)) if v)
    of = f" of {wanted}" if wanted else ""
    dropped = sum(r["invalid_call_samples"] for r in records if "left_out" not in r)
    dropped += sum(r["left_out"]["invalid_calls"] for r in records if "left_out" in r)
    left = f" ({dropped} with invalid calls left out: --invalid-calls drop)" if dropped else ""
    what = BY_NAME[fmt].row
    if BY_NAME[fmt].of_paths:
        raise InputError(f"no {what}{of} in {', '.join(runs)}{left}")
    rules = "; ".join(f"{r['run_id']}: rule {r['rule']}, min margin {r['min_margin']:g}" for r in records)
    why = " (no node has two finished attempts whose values differ by the margin)" if fmt == "dpo" and not of else ""
    unrecorded = sum(r["left_out"]["unrecorded"] for r in records)
    differing = sum(r["left_out"]["differing_prompts"] for r in records)
    if unrecorded or differing:
        why = (
            f" ({unrecorded} left out whose turns recorded no conversation: a run before conversations were "
            "recorded, or an opencode backend without --endpoint; "
            f"{differing} whose two attempts received different prompts)"
        )
    raise InputError(f"no {what}{of} in {', '.join(runs)}{left}{why} [{rules}]")


def _write_supervised(
    target: ExportDir, run: SupervisedRun, fmt: str, workspace: str, reasoning: bool, invalid: str
) -> dict[str, Any]:
    """Write one run's pairs, labels or step paths; return what the manifest says of it."""
    name = f"{run.run_id}.{fmt}.jsonl"
    target.start(name)
    written = Written()
    for sample in supervised_samples(run, fmt, workspace, reasoning, invalid == "drop", written):
        target.write(sample)
    target.end()
    chosen = run.chosen
    return {
        "run_id": run.run_id,
        "log_tail": run.tail,
        "selection_id": chosen["selection_id"],
        "rule": chosen["rule"],
        "min_margin": chosen["min_margin"],
        "threshold": chosen["threshold"],
        "against_verdict": chosen["against_verdict"],
        "file": name,
        "samples": sum(written.counts.values()),
        "left_out": {
            "unrecorded": written.unrecorded,
            "differing_prompts": written.differing_prompts,
            "no_answer": written.no_answer,
            "invalid_calls": written.dropped_invalid,
        },
        "invalid_call_samples": written.invalid,
        **({"against_verdict_pairs": written.against_verdict} if fmt == "dpo" else {}),
        "provenance": run.provenance,
        "supervision": run.counts,
        "counts": written.counts,
    }


@dataclass
class _RunExport:
    """What one run's samples are made of, read from its catalog and log."""

    run_id: str
    chosen: dict[str, Any]
    tail: int
    paths: list[dict[str, Any]]
    walks: dict[tuple[str, str], list[dict[str, Any]]]
    conversations: TurnConversations
    contents: Contents
    extras: tuple[dict, dict] | None
    agent: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)  # the run's row of run_provenance (the card's)
    coverage: list[dict[str, Any]] = field(default_factory=list)  # N_eff of the selection by task and stage

    def conversation(self, path: dict[str, Any], workspace: str) -> tuple[PathConversation, dict[str, Any]]:
        """A path's conversation, root to leaf, and its sample's metadata."""
        walk = self.walks[(path["tree_id"], path["leaf_id"])]
        turns = [self.conversations.parsed(path["tree_id"], (t["edge_id"], t["turn"])) for t in walk if t["turn"]]
        conv = join_turns(turns, self.contents)  # the workspaces already replaced in each turn's messages
        metadata = _metadata(
            self.run_id, self.chosen["selection_id"], path, walk, conv.interrupted, invalid_calls(conv), workspace
        )
        return conv, metadata


def path_sample(
    reader: Reader,
    run_id: str,
    tree_id: str,
    leaf_id: str,
    *,
    selection: str | None = None,
    workspace: str = DEFAULT_WORKSPACE,
    reasoning: bool = True,
) -> tuple[dict[str, Any], PathConversation]:
    """The ``chat`` sample ``export`` writes for one path of a run's selection (default: the run's
    default one), and the path's conversation (which turn each message belongs to), read through ``reader``.

    InputError when the selection has no path of that tree to that leaf.
    """
    log = EventLog(reader.data_dir, run_id).require()
    with reader.open(run_id) as catalog:
        return sample_in(log, catalog, tree_id, leaf_id, selection=selection, workspace=workspace, reasoning=reasoning)


def sample_in(
    log: EventLog,
    catalog: Catalog,
    tree_id: str,
    leaf_id: str,
    *,
    selection: str | None = None,
    workspace: str = DEFAULT_WORKSPACE,
    reasoning: bool = True,
) -> tuple[dict[str, Any], PathConversation]:
    """:func:`path_sample` from a catalog of the run already open (``catalog``: its state)."""
    run_id = log.run_id
    run = _prepare_run(log, catalog, selection, "chat", None, None, workspace, leaf=(tree_id, leaf_id))
    if not run.paths:
        msg = f"run {run_id!r}: selection {run.chosen['selection_id']!r} has no path of tree {tree_id!r} to {leaf_id!r}"
        raise InputError(msg)
    conv, metadata = run.conversation(run.paths[0], workspace)
    return chat_sample(conv, metadata, reasoning), conv


def _prepare_run(
    log: EventLog,
    catalog: Catalog,
    selection: str | None,
    fmt: str,
    task: str | None,
    stage: str | None,
    workspace: str,
    leaf: tuple[str, str] | None = None,
) -> _RunExport:
    """Read what one run's samples are made of (``catalog``: its state, from :mod:`engine.derived`);
    ``leaf``: only the path of that (tree id, leaf id)."""
    run_id = log.run_id
    chosen = recorded_selection(catalog, run_id, selection)
    tail = catalog.tail_seq()
    paths = catalog.query(
        "select * from int_paths__recorded where selection_id = ? and (? is null or task = ?) "
        "and (? is null or stage = ?) order by tree_id, rank, leaf_id",
        [chosen["selection_id"], task, task, stage, stage],
    )
    if leaf is not None:
        paths = [p for p in paths if (p["tree_id"], p["leaf_id"]) == leaf]
    walks = _walks(catalog, chosen["selection_id"], run_id, {(p["tree_id"], p["leaf_id"]) for p in paths})
    needed = {(t["edge_id"], t["turn"]) for walk in walks.values() for t in walk if t["turn"]}
    conversations, contents = read_conversations(log, catalog, tail, needed, workspace)
    placeholder = conversations.placeholder
    extras = _turn_facts(catalog, chosen["selection_id"], placeholder) if fmt == "atif" else None
    return _RunExport(run_id, chosen, tail, paths, walks, conversations, contents, extras, _agent(catalog, log))


def _write_run(
    target: ExportDir, run: _RunExport, fmt: str, workspace: str, reasoning: bool, invalid: str, lengths: Lengths
) -> dict[str, Any]:
    """Write one run's samples; return what the manifest says of it."""
    run_id, chosen = run.run_id, run.chosen
    name = f"{run_id}.{fmt}.jsonl"
    target.start(name)
    counts: Counter[tuple[str, str]] = Counter()
    with_invalid = 0
    for path in run.paths:
        conv, metadata = run.conversation(path, workspace)
        bad = metadata["invalid_calls"]
        with_invalid += bool(bad)
        if bad and invalid == "drop":
            continue
        lengths.add(name, path, conv, reasoning)
        if fmt == "chat":
            target.write(chat_sample(conv, metadata, reasoning))
        else:
            steps, calls = run.extras
            evals = {
                (t["edge_id"], t["turn"]): {k: t[k] for k in ("score", "eval_status", "outcome")}
                for t in run.walks[(path["tree_id"], path["leaf_id"])]
                if t["turn"]
            }
            target.write(atif_trajectory(conv, metadata, reasoning, run.agent, steps=steps, calls=calls, evals=evals))
        counts[(path["task"] or "", path["stage"] or "")] += 1
    target.end()
    return {
        "run_id": run_id,
        "log_tail": run.tail,
        "selection_id": chosen["selection_id"],
        "weights": chosen["weights"],
        "top_k": chosen["top_k"],
        "file": name,
        "samples": sum(counts.values()),
        "invalid_call_samples": with_invalid,
        "provenance": run.provenance,
        "coverage": run.coverage,
        "counts": counts,
    }


def _walks(
    catalog: Catalog, selection_id: str, run_id: str, wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Each wanted path's rows of ``int_path_turns``, root to leaf; every turn must have a conversation."""
    walks: dict[tuple[str, str], list[dict[str, Any]]] = {}
    rows = catalog.query(
        "select * from int_path_turns where selection_id = ? order by tree_id, leaf_id, depth, turn", [selection_id]
    )
    for row in rows:
        key = (row["tree_id"], row["leaf_id"])
        if key not in wanted:
            continue
        if row["turn"] and not row["has_conversation"]:
            msg = (
                f"run {run_id!r}: turn {row['turn']} of edge {row['edge_id']} (on the path to "
                f"{row['leaf_id']}) has no recorded conversation - it was run by a version before "
                "conversations were recorded, or by an opencode backend without --endpoint (whose "
                "requests nothing records); such a path cannot be exported"
            )
            raise LogError(msg)
        walks.setdefault(key, []).append(row)
    return walks


def _turn_facts(catalog: Catalog, selection_id: str, placeholder: Placeholder) -> tuple[dict, dict]:
    """The model calls' tokens and the tool calls' statuses of the selection's turns (for ATIF).

    A tool error names the worktree as the call's result does: it gets the placeholder too.
    """
    turns = "(edge_id, turn) in (select (edge_id, turn) from int_path_turns where selection_id = ? and turn > 0)"
    steps = {
        (r["edge_id"], r["turn"], r["step"]): r
        for r in catalog.query(
            "select edge_id, turn, step, tokens_input, tokens_output, tokens_reasoning, tokens_cache_read, cost "
            f"from stg_step_finished where {turns} order by seq",
            [selection_id],
        )
    }
    calls = {  # only the failed ones are reported
        (r["edge_id"], r["turn"], r["call_id"]): r | {"error": r["error"] and placeholder.text(r["error"])}
        for r in catalog.query(
            f"select edge_id, turn, call_id, status, error from stg_tool_called "
            f"where status = 'error' and {turns} order by seq",
            [selection_id],
        )
    }
    return steps, calls


def _agent(catalog: Catalog, log: EventLog) -> dict[str, Any]:
    """ATIF's agent: the Teacher backend, the version that recorded the run, its model."""
    config = recorded_config(catalog, log)
    version = catalog.query("select tool_version from run_config")[0]["tool_version"]
    model = config.backend_options.get("model") or config.backend
    return {"name": f"teacher-mcts {config.backend}", "version": version or "unknown", "model_name": model}


def _metadata(
    run_id: str,
    selection_id: str,
    path: dict[str, Any],
    walk: list[dict[str, Any]],
    interrupted: list[str],
    invalid: list[str],
    workspace: str,
) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {}
    for t in walk:
        nodes.setdefault(
            t["node_id"], {"node_id": t["node_id"], "depth": t["depth"], "score": t["node_score"], "tok": t["node_tok"]}
        )
    return {
        "run_id": run_id,
        "selection_id": selection_id,
        "task": path["task"],
        "stage": path["stage"],
        "snapshot": path["snapshot"],
        "tree_id": path["tree_id"],
        "leaf_id": path["leaf_id"],
        "node_ids": path["node_ids"],
        **{k: path[k] for k in PATH_FIELDS},
        "nodes": list(nodes.values()),
        "turns": [{k: t[k] for k in TURN_FIELDS} for t in walk if t["turn"]],
        "interrupted_calls": interrupted,
        "invalid_calls": invalid,
        "workspace": workspace,
    }


def _manifest(
    records: list[dict[str, Any]],
    files: dict[str, dict[str, Any]],
    fmt: str,
    selection: str | None,
    task: str | None,
    stage: str | None,
    workspace: str,
    reasoning: bool,
    invalid: str,
    lengths: Lengths,
) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        for (t, s), n in sorted(record.pop("counts").items()):
            counts.setdefault(t, {})[s] = counts.get(t, {}).get(s, 0) + n
    return {
        "made_by": MADE_BY,
        "format": fmt,
        "selection": selection or "default",
        "filters": {"task": task, "stage": stage},
        "workspace": workspace,
        "reasoning": reasoning,
        "invalid_calls": invalid,
        "runs": records,
        "counts": counts,
        "samples": sum(r["samples"] for r in records),
        "files": files,
        **(lengths.manifest() if BY_NAME[fmt].of_paths else {}),
    }
