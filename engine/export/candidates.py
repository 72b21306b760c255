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
from engine.export.conversations import PathConversation, join_turns, read_conversations
from engine.export.formats import chat_sample
from engine.export.paths import path_metadata, unrecorded
from ingest.errors import InputError
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
            raise unrecorded(run_id, row)
    needed = {(t["edge_id"], t["turn"]) for t in walk if t["turn"]}
    conversations, contents = read_conversations(log, catalog, catalog.tail_seq(), needed, workspace)
    conv = join_turns([conversations.parsed(tree_id, (t["edge_id"], t["turn"])) for t in walk if t["turn"]], contents)
    metadata = path_metadata(run_id, None, path, walk, conv, workspace, selected=path["selected"])
    return chat_sample(conv, metadata, reasoning), conv
