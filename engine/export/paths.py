"""The path formats' samples (``chat``, ``atif``): what one run's are made of, and how they are written.

A path of a recorded path selection (``int_paths__recorded``) is walked root to leaf by ``int_path_turns``;
its turns' recorded conversations (:mod:`engine.export.conversations`) joined make its conversation, and its
metadata names the run, the selection, the path's fields, its nodes and its turns' eval results. The viewer's
sample of any candidate path (:mod:`engine.export.candidates`) is made by the same walk check and metadata.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from engine.catalog import Catalog
from engine.config import recorded_config
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
from engine.export.output import ExportDir
from engine.export_formats import DEFAULT_WORKSPACE
from engine.runset import Reader
from engine.selections import recorded_selection
from ingest.errors import InputError, LogError
from ingest.log import EventLog

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
class PathRun:
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
        metadata = path_metadata(self.run_id, self.chosen["selection_id"], path, walk, conv, workspace)
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
    run = prepare_paths(
        log, catalog, selection, "chat", task=None, stage=None, workspace=workspace, leaf=(tree_id, leaf_id)
    )
    if not run.paths:
        msg = f"run {run_id!r}: selection {run.chosen['selection_id']!r} has no path of tree {tree_id!r} to {leaf_id!r}"
        raise InputError(msg)
    conv, metadata = run.conversation(run.paths[0], workspace)
    return chat_sample(conv, metadata, reasoning), conv


def prepare_paths(
    log: EventLog,
    catalog: Catalog,
    selection: str | None,
    fmt: str,
    *,
    task: str | None,
    stage: str | None,
    workspace: str,
    leaf: tuple[str, str] | None = None,
) -> PathRun:
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
    return PathRun(run_id, chosen, tail, paths, walks, conversations, contents, extras, _agent(catalog, log))


def write_paths(
    target: ExportDir, run: PathRun, fmt: str, *, workspace: str, reasoning: bool, invalid: str, lengths: Lengths
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
            raise unrecorded(run_id, row, "; such a path cannot be exported")
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


def path_metadata(
    run_id: str,
    selection_id: str | None,
    path: dict[str, Any],
    walk: list[dict[str, Any]],
    conv: PathConversation,
    workspace: str,
    **extra: Any,
) -> dict[str, Any]:
    """A path's sample's metadata: its run and selection (``extra`` after them), its fields, its nodes and turns."""
    nodes: dict[str, dict[str, Any]] = {}
    for t in walk:
        nodes.setdefault(
            t["node_id"], {"node_id": t["node_id"], "depth": t["depth"], "score": t["node_score"], "tok": t["node_tok"]}
        )
    return {
        "run_id": run_id,
        "selection_id": selection_id,
        **extra,
        "task": path["task"],
        "stage": path["stage"],
        "snapshot": path["snapshot"],
        "tree_id": path["tree_id"],
        "leaf_id": path["leaf_id"],
        "node_ids": path["node_ids"],
        **{k: path[k] for k in PATH_FIELDS},
        "nodes": list(nodes.values()),
        "turns": [{k: t[k] for k in TURN_FIELDS} for t in walk if t["turn"]],
        "interrupted_calls": conv.interrupted,
        "invalid_calls": invalid_calls(conv),
        "workspace": workspace,
    }


def unrecorded(run_id: str, row: dict[str, Any], why: str = "") -> LogError:
    """The error of a path whose turn (``row`` of its walk) recorded no conversation."""
    return LogError(
        f"run {run_id!r}: turn {row['turn']} of edge {row['edge_id']} (on the path to {row['leaf_id']}) has no "
        "recorded conversation - it was run by a version before conversations were recorded, or by an opencode "
        f"backend without --endpoint (whose requests nothing records){why}"
    )
