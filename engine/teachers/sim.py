"""A deterministic simulated Teacher (``--backend sim``).

Every turn is a function of (seed, edge id, turn, start checkpoint) only, so a
run's trees do not depend on scheduling or timing. The sim writes the same JSON
event stream ``opencode run --format json`` prints (step_start, tool_use, text,
step_finish...) and parses it with the real parser, so it produces the same kinds
of facts as a real session: individual tool calls with statuses and targets,
steps with token usage, message text, and an eval result.

Behaviour, per edge and per turn:
- the oriented score moves from the start state's latent quality with an
  edge-level drift and per-turn noise; about ``null_eval_rate`` of evals return no
  score (a crash or a timeout);
- an edge-level error propensity gives tool-error rates of 0 for about half the
  edges, 3-20% for most others and 30-60% for a tail; about ``hard_share`` of the
  roots are hard (more tool errors, a third of evals fail), so some trees run out
  of candidates;
- knowledge actions (reading or writing notes, ``coral notes``/``coral log``,
  loading a skill) appear in some turns;
- the session context grows 8-25k tokens a turn, so the 100k limit ends some
  branches at depth 2-4.

It records what its model "received" as a real Teacher's recorder does: a synthetic
system prompt naming the edge's workspace, the sim's tool definitions, and each
step's assistant message (its text and tool calls, in stream order) with the tool
results (``ContentRecorded`` system prompt and tools, ``ConversationRecorded``). These are made from the
stream after it is written, so they take nothing from the random draws: the sim's
scores, verdicts and trees are what they were without them.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine import __version__
from engine.config import problems
from engine.teachers.protocol import RootInfo, TurnCancelled, TurnRequest
from ingest.errors import InputError
from ingest.events import (
    ConversationRecorded,
    EvalFinished,
    Event,
    TurnFinished,
    canonical_json,
    content_fact,
)
from ingest.opencode_stream import StreamParser

PROMPT = "sim turn {turn}: improve the solution, then run coral eval."
CODE_FILES = ["solution.py", "bench.py", "tests/test_solution.py", "README.md"]
NOTE_NAMES = ["tiling.md", "grader-noise.md", "vector-path.md", "dead-ends.md"]
SYSTEM = (
    "You are a simulated coding agent improving a repository. Use the tools to read, edit "
    'and test the code; finish each attempt by running `coral eval -m "<summary>"`.\n'
    "<env>\n  Working directory: {workspace}\n  Is directory a git repo: yes\n</env>"
)


def _tool(tool: str, description: str, **properties: str) -> dict[str, Any]:
    """An OpenAI function definition whose parameters are required strings."""
    props = {key: {"type": "string", "description": text} for key, text in properties.items()}
    return {
        "type": "function",
        "function": {
            "name": tool,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": sorted(props),
                "additionalProperties": False,
            },
        },
    }


TOOLS = [
    _tool("bash", "Run a shell command in the workspace.", command="The command to run."),
    _tool("edit", "Edit a file in place.", filePath="The file to edit."),
    _tool("glob", "Find files by a glob pattern.", pattern="The glob pattern.", path="Where to look."),
    _tool("grep", "Search file contents.", pattern="The regular expression.", path="Where to look."),
    _tool("read", "Read a file.", filePath="The file to read."),
    _tool("skill", "Load a shared skill.", name="The skill's name."),
    _tool("write", "Write a file.", filePath="The file to write.", content="What to write."),
]
TOOLS_FACT = content_fact("tools", TOOLS)  # the same in every turn


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


MAX_LATENCY_S = 86_400.0


class SimOptions(BaseModel):
    """``backend_options`` of a ``sim`` run (TOML ``[backend_options]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # At most a day: a turn waits up to 1.5 x this, and a wait of 1e308 s overflowed
    # threading's timeout in every turn of the run (and of every resume).
    latency_s: float = Field(0.0, ge=0, le=MAX_LATENCY_S, description="mean seconds a turn takes")
    null_eval_rate: float = Field(0.10, ge=0, le=1)
    hard_share: float = Field(0.12, ge=0, le=1, description="share of hard roots")
    # The mean of an edge's drift, in units of the score's scale: how often the Teacher
    # improves (a task it solves everywhere: high; one it cannot: negative).
    drift_mean: float = Field(0.01, ge=-1, le=1)
    token_growth: tuple[int, int] = (8000, 25000)  # context tokens a turn adds: low, high
    # A fresh session starts with the system prompt and tool schemas (~30 KB).
    base_context: int = Field(9000, ge=0, le=10**12)
    calls_per_step: tuple[int, int] = (1, 3)  # tool calls per step: low, high

    @model_validator(mode="after")
    def _ranges(self) -> SimOptions:
        for name, top in (("token_growth", 10**12), ("calls_per_step", 1000)):
            low, high = getattr(self, name)
            if not 0 <= low <= high <= top:
                raise ValueError(f"{name} must be [low, high] with 0 <= low <= high <= {top}")
        return self


class SimTeacher:
    """Simulated Teacher; ``options`` come from ``backend_options`` in the run config."""

    name = "sim"
    version = f"sim {__version__}"  # the simulation is this project's

    def __init__(self, seed: int, options: dict[str, Any] | None = None) -> None:
        try:
            opts = SimOptions.model_validate(options or {})
        except ValidationError as err:
            raise InputError(f"sim backend options: {problems(err)}") from err
        self.seed = seed
        self.opts = opts

    # -- Teacher interface

    def root_state(self, root: RootInfo) -> dict[str, Any]:
        return {"quality": root.score, "ctx": 0, "session": None}

    def discard(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None

    def run_turn(self, request: TurnRequest, cancel: threading.Event) -> list[Event]:
        edge = _rng(self.seed, "edge", request.edge_id)
        rng = _rng(self.seed, "turn", request.edge_id, request.turn)
        hard = _rng(self.seed, "tree", request.tree_id).random() < self.opts.hard_share
        traits = self._edge_traits(edge, hard, self.opts.drift_mean)
        if self.opts.latency_s > 0 and cancel.wait(self.opts.latency_s * rng.uniform(0.5, 1.5)):
            raise TurnCancelled(f"{request.edge_id} turn {request.turn} cancelled")
        if cancel.is_set():
            raise TurnCancelled(f"{request.edge_id} turn {request.turn} cancelled")
        start = request.start_state
        session = start.get("session")
        fresh = session is None
        if request.fork or fresh:
            session = "ses_sim_" + hashlib.sha256(request.edge_id.encode()).hexdigest()[:20]
        ctx_start = self.opts.base_context if fresh else int(start.get("ctx") or 0)
        low, high = self.opts.token_growth
        growth = int(min(high, max(low, traits["growth"] * rng.uniform(0.9, 1.1))))
        lines = self._stream(rng, traits, session, ctx_start, growth, request)
        parser = StreamParser(request.tree_id, request.edge_id, request.turn)
        facts: list[Event] = []
        for line in lines:
            facts.extend(parser.feed(line))
        facts.extend(parser.finish())
        prompt = PROMPT.format(turn=request.turn)  # the same for every attempt from a node
        inherited = int(start.get("messages") or 0)
        conversation = _conversation(request, prompt, lines, inherited)
        facts.extend(conversation)
        quality = start.get("quality")
        score, status, new_quality = self._eval(rng, traits, quality, request.direction)
        facts.append(
            EvalFinished(
                tree_id=request.tree_id,
                edge_id=request.edge_id,
                turn=request.turn,
                score=score,
                eval_status=status,
                commit_hash=_commit(request),
                source="sim",
                feedback=None if score is None else f"sim score {score}",
            )
        )
        facts.append(
            TurnFinished(
                tree_id=request.tree_id,
                edge_id=request.edge_id,
                turn=request.turn,
                session_id=parser.summary.session_id,
                context_tokens=parser.summary.context_tokens,
                state={
                    "quality": new_quality,
                    "ctx": parser.summary.context_tokens,
                    "session": parser.summary.session_id,
                    "messages": inherited + len(conversation[-1].messages),
                },
                prompt=prompt,
                transcript="\n".join(lines) + "\n",
            )
        )
        return facts

    # -- the simulation

    @staticmethod
    def _edge_traits(edge: random.Random, hard: bool, drift_mean: float) -> dict[str, float]:
        # A hard root (a snapshot in a bad state) makes the Teacher fail more often.
        tier = edge.random()
        clean, mild = (0.3, 0.55) if hard else (0.5, 0.85)
        if tier < clean:
            err_p = 0.0
        elif tier < mild:
            err_p = edge.uniform(0.03, 0.20)
        else:
            err_p = edge.uniform(0.30, 0.60)
        return {
            "err_p": err_p,
            "null_eval": 0.35 if hard else -1.0,
            "know_p": edge.uniform(0.3, 0.95),
            "drift": edge.gauss(drift_mean, 0.03),
            "growth": edge.uniform(8000, 25000),  # tokens a turn adds to the session
        }

    def _eval(
        self, rng: random.Random, traits: dict[str, float], quality: float | None, direction: str
    ) -> tuple[float | None, str, float | None]:
        if quality is None:
            return None, "crashed", None
        sign = -1.0 if direction == "minimize" else 1.0
        scale = max(abs(quality), 1.0)
        new_quality = quality + sign * scale * (traits["drift"] + rng.gauss(0.0, 0.04))
        if rng.random() < max(self.opts.null_eval_rate, traits["null_eval"]):
            return None, rng.choice(["crashed", "timeout"]), quality
        score = round(new_quality + rng.gauss(0.0, 0.005 * scale), 4)
        status = "improved" if sign * (score - quality) > 0 else "regressed"
        return score, status, new_quality

    def _stream(
        self,
        rng: random.Random,
        traits: dict[str, float],
        session: str,
        ctx_start: int,
        growth: int,
        request: TurnRequest,
    ) -> list[str]:
        n_steps = rng.randint(2, 6)
        wants_knowledge = rng.random() < traits["know_p"]
        knowledge_step = rng.randint(1, n_steps - 1)
        clock = 1_796_000_000_000 + rng.randint(0, 10**9)
        lines: list[str] = []
        ctx = ctx_start
        call_no = 0

        def emit(kind: str, part: dict[str, Any]) -> None:
            nonlocal clock
            clock += rng.randint(50, 4000)
            lines.append(
                json.dumps(
                    {"type": kind, "timestamp": clock, "sessionID": session, "part": part}, separators=(",", ":")
                )
            )

        for step in range(1, n_steps + 1):
            emit("step_start", {"type": "step-start"})
            last = step == n_steps
            calls: list[tuple[str, dict[str, Any]]] = []
            if last:
                calls.append(("bash", {"command": f'coral eval -m "sim change, turn {request.turn}"'}))
            else:
                if wants_knowledge and step == knowledge_step:
                    calls.append(self._knowledge_call(rng))
                for _ in range(rng.randint(*self.opts.calls_per_step)):
                    calls.append(self._work_call(rng))
            for tool, inputs in calls:
                call_no += 1
                failed = not last and rng.random() < traits["err_p"]
                state: dict[str, Any] = {"status": "error" if failed else "completed", "input": inputs}
                if failed:
                    state["error"] = rng.choice(
                        [
                            "File not found: " + str(inputs.get("filePath", inputs.get("command"))),
                            "Could not find oldString in the file.",
                            "The read tool was called with invalid arguments.",
                        ]
                    )
                else:
                    state["output"] = "ok"
                emit(
                    "tool_use",
                    {
                        "type": "tool",
                        "tool": tool,
                        "state": state,
                        "callID": _call_id(request, call_no),
                    },
                )
            if last:
                emit("text", {"type": "text", "text": "Submitted the change with coral eval."})
            share = growth // n_steps if not last else growth - (growth // n_steps) * (n_steps - 1)
            output = rng.randint(100, 900)
            ctx += share
            emit(
                "step_finish",
                {
                    "type": "step-finish",
                    "reason": "stop" if last else "tool-calls",
                    "tokens": {
                        "total": ctx,
                        "input": ctx - output,
                        "output": output,
                        "reasoning": 0,
                        "cache": {"read": 0, "write": 0},
                    },
                    "cost": 0,
                },
            )
        return lines

    @staticmethod
    def _work_call(rng: random.Random) -> tuple[str, dict[str, Any]]:
        tool = rng.choices(["read", "edit", "bash", "grep", "glob", "write"], weights=[30, 20, 25, 10, 5, 10])[0]
        path = rng.choice(CODE_FILES)
        if tool == "bash":
            return tool, {"command": rng.choice(["python bench.py", "pytest -q", "git diff --stat"])}
        if tool == "grep":
            return tool, {"pattern": rng.choice(["TILE", "def matmul", "UNROLL"]), "path": "."}
        if tool == "glob":
            return tool, {"pattern": "**/*.py", "path": "."}
        return tool, {"filePath": path}

    @staticmethod
    def _knowledge_call(rng: random.Random) -> tuple[str, dict[str, Any]]:
        note = rng.choice(NOTE_NAMES)
        return rng.choice(
            [
                ("read", {"filePath": f".opencode/notes/{note}"}),
                ("write", {"filePath": f".opencode/notes/{note}", "content": "finding"}),
                ("bash", {"command": "coral notes"}),
                ("bash", {"command": "coral log --search tile"}),
                ("skill", {"name": "profile-kernel"}),
                ("grep", {"pattern": "TILE", "path": ".opencode/skills"}),
            ]
        )


def _conversation(request: TurnRequest, prompt: str, lines: list[str], inherited: int) -> list[Event]:
    """The contents and the ConversationRecorded fact of a sim turn, read from its stream.

    Each step is one model call: an assistant message (its text, its tool calls in
    stream order), then one tool message per call with its output or error.
    """
    workspace = "/sim/worktrees/{}/{}/wt".format(
        *(re.sub(r"[^A-Za-z0-9_.-]", "_", x) for x in (request.tree_id, request.edge_id))
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    text = ""
    steps = 0
    for line in lines:
        event = json.loads(line)
        part = event["part"]
        if event["type"] == "tool_use":
            state = part["state"]
            calls.append(
                {
                    "id": part["callID"],
                    "type": "function",
                    "function": {"name": part["tool"], "arguments": canonical_json(state["input"])},
                }
            )
            results.append(
                {"role": "tool", "tool_call_id": part["callID"], "content": state.get("output", state.get("error", ""))}
            )
        elif event["type"] == "text":
            text += part["text"]
        elif event["type"] == "step_finish":
            steps += 1
            answer: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                answer["tool_calls"] = calls
            messages += [answer, *results]
            calls, results, text = [], [], ""
    system = content_fact("system", [{"role": "system", "content": SYSTEM.format(workspace=workspace)}])
    tools = TOOLS_FACT
    return [
        system,
        tools,
        ConversationRecorded(
            tree_id=request.tree_id,
            edge_id=request.edge_id,
            turn=request.turn,
            system_id=system.content_id,
            tools_id=tools.content_id,
            base=inherited,
            turn_start=inherited,
            model_calls=steps,
            workspace=workspace,
            recorder="sim",
            messages=messages,
        ),
    ]


def _call_id(request: TurnRequest, call_no: int) -> str:
    """A call's id: unique along a path (a path has one edge a layer), the same in every attempt from a node
    (as the prompt), naming nothing of the run (and compressing as well as the edge id did)."""
    return f"call_{request.parent_id.count('.') + 1}_{request.turn}_{call_no}"


def _commit(request: TurnRequest) -> str:
    return hashlib.sha1(f"{request.edge_id}|{request.turn}".encode()).hexdigest()
