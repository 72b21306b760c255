"""Immutable event models: facts observed and decisions taken, one ``kind`` each.

Every event is stored as one row of one wide Arrow/Parquet schema (``ingest.schema``:
the columns, and events to rows and back).

Facts are named in the past tense. Decisions subclass :class:`Decision` and carry
``watermark``: the seq of the last event the decision saw (ALGORITHM §6).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ingest.text import as_utf8, canonical_json  # noqa: F401 - as_utf8 re-exported

SCHEMA_VERSION = 1

# Columns a view must never read: bulky text kept for audits and SFT export.
# The in-memory mirror that the live engine queries leaves them out.
HEAVY = {"heavy": True}


class Event(BaseModel):
    """Base of everything appended to the log; identity is (run_id, seq)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str]
    schema_version: int = SCHEMA_VERSION

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__name__.startswith("_") and cls.__name__ != "Decision":
            cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


class Decision(Event):
    """An engine decision; ``watermark`` is the seq of the last event it saw."""

    watermark: int


# ---------------------------------------------------------------- run facts


class RunStarted(Event):
    """A run began; ``config`` is the whole resolved configuration (secrets redacted); ``tool_version``
    this project's version, ``teacher_version`` the Teacher runtime's (``opencode-ai 1.18.33``; None
    in runs recorded before it was)."""

    command: str
    task: str | None = None
    direction: Literal["maximize", "minimize"] = "maximize"
    config: dict[str, Any] = Field(default_factory=dict)
    tool_version: str = ""
    teacher_version: str | None = None


class RunResumed(Event):
    """A run was continued from its log after an interruption (``teacher_version``: as RunStarted's)."""

    note: str = ""
    teacher_version: str | None = None


class RunFinished(Event):
    """A run ended normally."""

    outcome: str = "completed"


# ----------------------------------------------------------- snapshot facts


class SnapshotSeen(Event):
    """One folder of an ``all_snapshots`` dir was read (ALGORITHM §1.1-1.2).

    ``skip_reason`` is set when the folder is not a candidate; ``score`` is the
    raw attempt score when it is a finite number, else null with ``score_problem``.
    An attempt of a CORAL run read as a snapshot (``ingest.coral_run``) has its
    attempt file as ``path`` and ``shared_state_hash``: the checkpoint of the run's
    ``public/`` its shared dir is exported from.
    """

    task: str
    snapshot: str
    path: str
    global_index: int | None = None
    agent_id: str | None = None
    short_hash: str | None = None
    commit_hash: str | None = None
    eval_count: int | None = None
    eval_ok: bool | None = None
    eval_ok_json: str | None = None
    score: float | None = None
    score_problem: str | None = None
    attempt_file: str | None = None
    attempt_status: str | None = None
    shared_state_hash: str | None = None
    skip_reason: str | None = None


class SnapshotsPicked(Decision):
    """The roots chosen for a task, with each candidate's stage and reason (ALGORITHM §1.11)."""

    task: str
    detail: list[dict[str, Any]] = Field(default_factory=list)


# --------------------------------------------------------------- tree facts


class RootAdded(Event):
    """A selected snapshot became the root of tree ``tree_id``."""

    tree_id: str
    task: str
    snapshot: str
    path: str
    global_index: int | None = None
    agent_id: str | None = None
    commit_hash: str | None = None
    score: float | None = None
    stage: str | None = None
    selection_reason: str | None = None


def edge_id(parent_id: str, slot: int, attempt: int) -> str:
    """The id of an edge attempt: ``<parent>/e<slot>-<attempt>`` (the views' macro edge_id)."""
    return f"{parent_id}/e{slot}-{attempt}"


class EdgeStarted(Event):
    """An edge attempt from ``parent_id`` was launched (``slot``: direction or ordinal)."""

    tree_id: str
    edge_id: str
    parent_id: str
    slot: int
    attempt: int

    @model_validator(mode="after")
    def _id_follows(self) -> EdgeStarted:
        # ALGORITHM §6: ids are deterministic; the views read an edge's place from its id.
        expected = edge_id(self.parent_id, self.slot, self.attempt)
        if self.edge_id != expected:
            raise ValueError(f"edge_id {self.edge_id!r} must be {expected!r}")
        return self


class ToolCalled(Event):
    """One tool call of a rollout turn finished with status ``ok`` or ``error``."""

    tree_id: str
    edge_id: str
    turn: int
    step: int
    call_id: str
    tool: str
    status: Literal["ok", "error"]
    target: str | None = None
    error: str | None = None


class StepFinished(Event):
    """One assistant step (one model call) of a turn finished, with its token usage."""

    tree_id: str
    edge_id: str
    turn: int
    step: int
    reason: str | None = None
    tokens_input: int = 0
    tokens_output: int = 0
    tokens_reasoning: int = 0
    tokens_cache_read: int = 0
    tokens_cache_write: int = 0
    tokens_total: int = 0
    cost: float = 0.0


class MessageWritten(Event):
    """The assistant wrote a text or reasoning part."""

    tree_id: str
    edge_id: str
    turn: int
    step: int
    part: Literal["text", "reasoning"] = "text"
    text: str = Field(default="", json_schema_extra=HEAVY)


class EvalFinished(Event):
    """The turn's ``coral eval`` returned; ``score`` is null when no number came back.

    ``grader_log`` is the output of the CORAL grader daemon that ran beside the turn
    (with ``--coral-dir``). ``error`` is the first line of the feedback of an eval
    that gave no number in a turn that completed (what the grader said went wrong;
    the view ``int_edges__eval_errors`` compares it across edges).
    """

    tree_id: str
    edge_id: str
    turn: int
    score: float | None = None
    eval_status: str | None = None
    commit_hash: str | None = None
    source: str | None = None
    error: str | None = None
    feedback: str | None = Field(default=None, json_schema_extra=HEAVY)
    grader_log: str | None = Field(default=None, json_schema_extra=HEAVY)


class GraderChecked(Event):
    """Before the first turn, the task's grader graded a root's own code unchanged.

    With ``--coral-dir``: CORAL's grader daemon graded a pending attempt of the root's
    commit in a throwaway edge layout, as it grades every turn's eval. ``score`` and
    ``eval_status`` are what it gave (null: no number), ``recorded_score`` the score
    the Student run recorded for the root, ``error`` the first line of its feedback
    when it gave no number; ``feedback`` and ``grader_log`` (the daemon's output)
    are kept for the user. The view ``int_grader_checks`` derives the outcome.
    """

    tree_id: str
    commit_hash: str | None = None
    score: float | None = None
    recorded_score: float | None = None
    eval_status: str | None = None
    error: str | None = None
    wall_seconds: float | None = None
    feedback: str | None = Field(default=None, json_schema_extra=HEAVY)
    grader_log: str | None = Field(default=None, json_schema_extra=HEAVY)


class StreamLineSkipped(Event):
    """A line of a Teacher's event stream could not be used (unknown type, invalid JSON)."""

    tree_id: str
    edge_id: str
    turn: int
    line_no: int
    problem: str
    line: str = Field(default="", json_schema_extra=HEAVY)


class ContentRecorded(Event):
    """A system prompt or a tool list a model received, recorded once per run.

    ``body`` is canonical JSON (sorted keys): the list of leading system messages, or
    the list of tool definitions. ``content_id`` is its digest (:func:`content_id`);
    conversations refer to it.
    """

    content_id: str
    content_kind: Literal["system", "tools"]
    body: str = Field(default="", json_schema_extra=HEAVY)


def content_id(kind: str, body: str) -> str:
    """The id of a recorded content: a digest of its kind and canonical body."""
    return hashlib.sha256(f"{kind}\n{body}".encode()).hexdigest()[:24]


def content_fact(kind: str, value: Any) -> ContentRecorded:
    """The ContentRecorded fact of a system prompt or a tool list."""
    body = canonical_json(value)
    return ContentRecorded(content_id=content_id(kind, body), content_kind=kind, body=body)


class ConversationRecorded(Event):
    """What the model received in a turn: its last request's messages, and its answer.

    The turn's conversation is the one its session was forked from (the previous turn
    of the path; none at a fresh session), cut to its first ``base`` messages, then
    ``messages``: the chat messages of the turn's last request from ``base`` on and,
    when the model finished answering it, the answer (the system prompt and the tools
    are ``ContentRecorded``). ``base`` is the inherited length when the turn's
    first request began with exactly the inherited conversation, else 0 (the whole
    conversation is here). ``turn_start`` is the index of the turn's own user prompt;
    ``model_calls`` the requests the turn sent (answered or not); ``workspace`` the
    directory the turn ran in (export replaces it with a placeholder).
    """

    tree_id: str
    edge_id: str
    turn: int
    system_id: str | None = None
    tools_id: str | None = None
    base: int = 0
    turn_start: int = 0
    model_calls: int = 0
    workspace: str | None = None
    recorder: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra=HEAVY)


class TurnFinished(Event):
    """A rollout turn ended; ``state`` is the backend checkpoint to fork from later.

    ``context_tokens`` is the session context at the end of the turn (ALGORITHM §2 ``tok``).
    ``started_at`` and ``wall_seconds`` are wall-clock and never feed a decision, nor do
    the turn's phases (None where the backend cannot tell): ``startup_seconds`` from the
    turn's start to its first request to the model, ``model_seconds`` the time the model
    took to answer, ``tool_seconds`` the time some tool call ran, ``eval_seconds`` the
    time its eval commands ran (part of the tool time). ``lost_server`` names the Teacher
    process (an ``opencode serve`` incarnation) whose loss failed the turn (outcome
    ``error``): the turns one loss failed count once in ``int_turns__failing``.
    """

    tree_id: str
    edge_id: str
    turn: int
    session_id: str | None = None
    context_tokens: int = 0
    outcome: Literal["completed", "timeout", "error"] = "completed"
    error: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    wall_seconds: float | None = None
    startup_seconds: float | None = None
    model_seconds: float | None = None
    tool_seconds: float | None = None
    eval_seconds: float | None = None
    lost_server: str | None = None
    prompt: str = Field(default="", json_schema_extra=HEAVY)
    transcript: str = Field(default="", json_schema_extra=HEAVY)


class SpoolEntryDropped(Event):
    """A finished turn kept in the run's spool was not taken; its turn runs again.

    ``reason``: the file is another run's, was kept for another start state of the
    edge (a stale one), or is damaged or torn.
    """

    tree_id: str
    edge_id: str
    turn: int
    reason: str


# ---------------------------------------------------------- tree decisions


class TurnSkipped(Decision):
    """Turn ``turn`` of an edge was not run because the edge can no longer be kept."""

    tree_id: str
    edge_id: str
    turn: int
    reason: str


class EdgeJudged(Decision):
    """The verdict of a finished edge attempt; ``child_id`` is set when it is kept."""

    tree_id: str
    edge_id: str
    verdict: Literal["kept", "kept_exempt", "pruned", "retry"]
    child_id: str | None = None


class NodeSelected(Decision):
    """The node a free slot expands next, with the scores that chose it."""

    tree_id: str
    node_id: str
    select_score: float
    q: float
    t: float


class TreeStopped(Decision):
    """A tree met a stop condition; no edge starts in it afterwards."""

    tree_id: str
    reason: Literal["good_leaves", "max_edges", "exhausted", "budget"]


class RunStopped(Decision):
    """The run stops before its trees are done (``int_run__stopping``): its grader failed
    the check before the first turn (``grader_check``), or ``eval_error_limit`` edges in
    a row had every eval fail with the same error (``eval_errors``). ``error`` says why."""

    reason: Literal["grader_check", "eval_errors"]
    error: str


class PathsSelected(Decision):
    """A Top-k selection of root-to-leaf paths under given weights (ALGORITHM §3)."""

    selection_id: str
    weights: dict[str, float]
    top_k: int
    paths: list[dict[str, Any]] = Field(default_factory=list)


class SupervisionSelected(Decision):
    """The preference pairs, unpaired labels and step labels of the run's trees under a rule
    (ALGORITHM §3, views ``pairs``, ``labels``, ``steps``): each attempt is valued by ``rule``
    (``soft`` or ``improved``); two attempts from one node pair when their values differ by at
    least ``min_margin``; an attempt or a path's edge is labelled good when its value is at least
    ``threshold``. ``against_verdict``: ``drop`` makes no pair whose chosen attempt failed the tree's
    prune test while the rejected one passed it, ``keep`` makes them (None: a selection recorded
    before the rule had this part, which kept them). The lists hold the ids and values the exports
    are made of."""

    selection_id: str
    rule: str
    min_margin: float
    threshold: float
    against_verdict: Literal["keep", "drop"] | None = None
    pairs: list[dict[str, Any]] = Field(default_factory=list)
    labels: list[dict[str, Any]] = Field(default_factory=list)
    step_paths: list[dict[str, Any]] = Field(default_factory=list)


# ------------------------------------------------------------ campaign budget


class BlockGranted(Event):
    """A campaign granted this run's tree ``edges`` more valid edges (in its round ``round``).

    A fact of the run: the decision is the campaign's (``BudgetAllocated`` in its log).
    A run whose config has ``grants`` starts an edge in a tree only while the tree's
    grants exceed its kept edges and edges in flight (``int_trees__asof``).
    """

    tree_id: str
    edges: int
    round: int


class GrantsClosed(Event):
    """The campaign grants this run nothing more (``reason``): a tree whose grants are used stops (``budget``)."""

    reason: str


class CampaignTaskAdded(Event):
    """A task of the campaign, explored by the run ``task_run`` from ``source``."""

    task: str
    task_run: str
    source: str


class BudgetAllocated(Decision):
    """A campaign round's blocks of budget: ``grants`` (task, run, tree_id, edges, gain), read at
    each run's tail ``marks`` (run id -> seq) by the policy's ``rule`` (``first_pass`` or ``coverage``)."""

    round: int
    rule: str
    marks: dict[str, int]
    grants: list[dict[str, Any]] = Field(default_factory=list)


class CampaignStopped(Decision):
    """The campaign grants no more from round ``round`` on, read at each run's tail ``marks``: its
    budget is spent (``budget_spent``), or no tree can grow (``trees_stopped``)."""

    round: int
    marks: dict[str, int]
    reason: Literal["budget_spent", "trees_stopped"]


# ------------------------------------------------------------------ schema


def _concrete_subclasses(cls: type) -> list[type[Event]]:
    out: list[type[Event]] = []
    for sub in cls.__subclasses__():
        if sub is not Decision:
            out.append(sub)
        out.extend(_concrete_subclasses(sub))
    return out


EVENT_TYPES: dict[str, type[Event]] = {c.kind: c for c in _concrete_subclasses(Event)}
DECISION_KINDS = frozenset(k for k, c in EVENT_TYPES.items() if issubclass(c, Decision))
# The kinds only a campaign's log holds (with its RunStarted, RunResumed and RunFinished).
CAMPAIGN_KINDS = frozenset(c.kind for c in (CampaignTaskAdded, BudgetAllocated, CampaignStopped))
