"""Any candidate path's conversation, selected or not: what the viewer shows of a path no selection holds.

``export`` writes the paths of a recorded selection (``int_paths__recorded``); a tree
has more root-to-leaf paths than it selects, and a researcher deciding what to train on
reads the others too. The same chat sample is made for any path of ``paths`` as of now,
walked by ``path_turns`` (the walk of ``int_path_turns`` over the candidates), its
metadata naming no selection and carrying whether the path is selected and its rank.
"""

from __future__ import annotations

from typing import Any

from engine.catalog import Catalog
from engine.export import PATH_FIELDS, TURN_FIELDS
from engine.export.conversations import PathConversation, invalid_calls, join_turns, read_conversations
from engine.export.formats import chat_sample
from ingest.errors import InputError, LogError
from ingest.log import EventLog


def candidate_sample(
    log: EventLog, catalog: Catalog, tree_id: str, leaf_id: str, workspace: str, reasoning: bool = True
) -> tuple[dict[str, Any], PathConversation]:
    """The chat sample of the path of ``paths`` to ``leaf_id`` (selected or not) and its conversation.

    InputError when the tree has no such path; LogError when a turn on it recorded no conversation.
    """
    run_id = log.run_id
    found = catalog.query("select * from paths where tree_id = ? and leaf_id = ?", [tree_id, leaf_id])
    if not found:
        raise InputError(f"run {run_id!r}: tree {tree_id!r} has no path to {leaf_id!r}")
    path = found[0]
    walk = catalog.query(
        "select * from path_turns where tree_id = ? and leaf_id = ? order by depth, turn", [tree_id, leaf_id]
    )
    for row in walk:
        if row["turn"] and not row["has_conversation"]:
            msg = (
                f"run {run_id!r}: turn {row['turn']} of edge {row['edge_id']} (on the path to {leaf_id}) "
                "has no recorded conversation - it was run by a version before conversations were recorded, "
                "or by an opencode backend without --endpoint (whose requests nothing records)"
            )
            raise LogError(msg)
    needed = {(t["edge_id"], t["turn"]) for t in walk if t["turn"]}
    conversations, contents = read_conversations(log, catalog, catalog.tail_seq(), needed, workspace)
    conv = join_turns([conversations.parsed(tree_id, (t["edge_id"], t["turn"])) for t in walk if t["turn"]], contents)
    nodes: dict[str, dict[str, Any]] = {}
    for t in walk:
        nodes.setdefault(
            t["node_id"], {"node_id": t["node_id"], "depth": t["depth"], "score": t["node_score"], "tok": t["node_tok"]}
        )
    metadata = {
        "run_id": run_id,
        "selection_id": None,
        "selected": path["selected"],
        "task": path["task"],
        "stage": path["stage"],
        "snapshot": path["snapshot"],
        "tree_id": tree_id,
        "leaf_id": leaf_id,
        "node_ids": path["node_ids"],
        **{k: path[k] for k in PATH_FIELDS},
        "nodes": list(nodes.values()),
        "turns": [{k: t[k] for k in TURN_FIELDS} for t in walk if t["turn"]],
        "interrupted_calls": conv.interrupted,
        "invalid_calls": invalid_calls(conv),
        "workspace": workspace,
    }
    return chat_sample(conv, metadata, reasoning), conv
