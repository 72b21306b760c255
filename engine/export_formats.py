"""The export formats, each stated once (light: the command line builds its choices from them).

``chat`` and ``atif`` write the selected paths of a recorded path selection; the supervised
formats write a recorded supervision selection's pairs (``dpo``), labelled attempts (``kto``)
or each path's edges with step labels (``steps``). A :class:`Format` holds everything said of
one: the decision its rows come from, the view and order of its recorded rows, what one row
is, and the dataset card's title and description; rendering a row is the export's
(:mod:`engine.export.formats` for paths, :mod:`engine.export.supervised` for the others).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_WORKSPACE = "/workspace"  # what a sample says for the worktree (``--workspace``), and the transcripts'


@dataclass(frozen=True)
class Format:
    """One export format: ``name`` (``--format``), ``decision`` (the log kind its rows are recorded by),
    ``row`` (what one row is, in messages), ``title`` and ``rows`` (the dataset card's), and for a
    supervised format the ``view`` of its recorded rows and their ``order``."""

    name: str
    decision: str
    row: str
    title: str
    rows: str
    view: str | None = None
    order: str | None = None

    @property
    def of_paths(self) -> bool:
        """Whether its rows are a path selection's paths (``chat``, ``atif``), not a supervision selection's."""
        return self.decision == "paths_selected"


_PATHS = "paths_selected"
_SUPERVISION = "supervision_selected"
BY_NAME = {
    f.name: f
    for f in (
        Format(
            "chat",
            _PATHS,
            "selected path",
            "SFT samples (OpenAI chat messages with tools)",
            "One row per selected root-to-leaf path: `messages` (the conversation the Teacher's model had along "
            "the path, root to leaf, as it received it), `tools` (the tool definitions it was offered, JSON text) "
            "and `metadata` (the path's scores, nodes, turns and evals).",
        ),
        Format(
            "atif",
            _PATHS,
            "selected path",
            "SFT trajectories (ATIF v1.4)",
            "One trajectory per selected root-to-leaf path: system, user and agent steps, each agent step with "
            "its tool calls, their results, its token metrics, its tool errors and the turn's eval.",
        ),
        Format(
            "dpo",
            _SUPERVISION,
            "preference pair",
            "preference pairs (TRL conversational preference)",
            "One row per preference pair: two attempts from one node of a tree. `prompt` is what both attempts' "
            "model received before its first answer; `chosen` and `rejected` are each attempt's own messages from "
            "that answer on (both turns: answers, tool results, the next turn's prompt and the eval output between "
            "them). Only the assistant messages are the model's: score only those (docs/TRAINING.md). "
            "`metadata.shared_prompt` is false in rows of logs whose turn prompts named their attempt: there the "
            "prompt ends before the turn prompts.",
            "int_pairs__recorded",
            "tree_id, node_key(node_id), chosen_id, rejected_id",
        ),
        Format(
            "kto",
            _SUPERVISION,
            "labelled attempt",
            "labelled attempts (TRL unpaired preference)",
            "One row per finished attempt: `prompt` (what its model received before its first answer), "
            "`completion` (its own messages from that answer on) and `label` (good or bad under the rule). "
            "Retried, pruned and failed attempts are labelled, not dropped. Only the assistant messages are the "
            "model's.",
            "int_labels__recorded",
            "tree_id, edge_id",
        ),
        Format(
            "steps",
            _SUPERVISION,
            "root-to-leaf path",
            "step-labelled paths (TRL stepwise supervision)",
            "One row per root-to-leaf path of kept edges: `prompt` (up to the model's first answer), "
            "`completions` (each edge's own messages, root to leaf) and `labels` (each edge's label under the "
            "rule).",
            "int_steps__recorded",
            "tree_id, node_key(leaf_id)",
        ),
    )
}
FORMATS = tuple(BY_NAME)
PATH_FORMATS = tuple(name for name, f in BY_NAME.items() if f.of_paths)
SUPERVISED_FORMATS = tuple(name for name, f in BY_NAME.items() if not f.of_paths)
