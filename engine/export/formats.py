"""The two sample formats of an export: OpenAI chat (SFT trainers) and ATIF trajectories.

``chat``: one JSON object per path with ``messages`` (OpenAI chat messages: system,
user, assistant with ``tool_calls`` whose ``function.arguments`` is a JSON string,
``tool`` with ``tool_call_id``; reasoning as ``reasoning_content``), ``tools`` (the
tool definitions the model was offered, as a JSON string: their JSON schemas differ
from tool to tool, which one Arrow column type cannot hold; a chat template wants
``json.loads(sample["tools"])``) and ``metadata``.

``atif``: the Agent Trajectory Interchange Format v1.4 (Harbor): system, user and
agent steps; an agent step's tool calls, their results as its observation, its
token metrics, and in its ``extra`` its turn, the tool errors of its calls and, on
a turn's last step, the turn's eval result (ATIF has no error field).
"""

from __future__ import annotations

import json
from typing import Any

from engine.export.conversations import PathConversation, TurnKey
from ingest.errors import InputError

ATIF_VERSION = "ATIF-v1.4"

# (edge_id, turn, step) -> the StepFinished columns of that model call.
StepMetrics = dict[tuple[str, int, int], dict[str, Any]]
# (edge_id, turn, call_id) -> the ToolCalled columns of that call.
CallFacts = dict[tuple[str, int, str], dict[str, Any]]


def chat_sample(conv: PathConversation, metadata: dict[str, Any], reasoning: bool) -> dict[str, Any]:
    """The chat-format sample of a path."""
    messages = [*conv.system, *conv.messages]
    if not reasoning:
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    return {"messages": messages, "tools": json.dumps(conv.tools, ensure_ascii=False), "metadata": metadata}


def atif_trajectory(
    conv: PathConversation,
    metadata: dict[str, Any],
    reasoning: bool,
    agent: dict[str, Any],
    *,
    steps: StepMetrics,
    calls: CallFacts,
    evals: dict[TurnKey, dict[str, Any]],
) -> dict[str, Any]:
    """The ATIF trajectory of a path (see the module docstring)."""
    out: list[dict[str, Any]] = [{"source": "system", "message": _text(m.get("content"))} for m in conv.system]
    last_step_of: dict[TurnKey, dict[str, Any]] = {}
    step_no: dict[TurnKey, int] = {}
    for message, owner in zip(conv.messages, conv.owners, strict=True):
        role = message.get("role")
        if role == "tool":
            _observe(out, message)
            continue
        if role != "assistant":
            out.append({"source": "system" if role == "system" else "user", "message": _text(message.get("content"))})
            continue
        step = _agent_step(message, reasoning)
        if owner is not None:
            edge_id, turn = owner
            step_no[owner] = step_no.get(owner, 0) + 1
            step["extra"] = {"edge_id": edge_id, "turn": turn, "model_call": step_no[owner]}
            metrics = steps.get((edge_id, turn, step_no[owner]))
            if metrics is not None:
                step["metrics"] = _metrics(metrics)
            errors = [
                {"tool_call_id": c["tool_call_id"], "function_name": c["function_name"], "error": fact.get("error")}
                for c in step.get("tool_calls", [])
                if (fact := calls.get((edge_id, turn, c["tool_call_id"]))) and fact["status"] == "error"
            ]
            if errors:
                step["extra"]["tool_errors"] = errors
            last_step_of[owner] = step
        out.append(step)
    for owner, step in last_step_of.items():
        if owner in evals:
            step["extra"]["eval"] = evals[owner]
    for i, step in enumerate(out, start=1):
        step["step_id"] = i
    return {
        "schema_version": ATIF_VERSION,
        "session_id": f"{metadata['run_id']}:{metadata['tree_id']}:{metadata['leaf_id']}",
        "agent": agent | {"extra": {"tool_definitions": conv.tools}},
        "steps": out,
        "final_metrics": _final_metrics(out),
        "extra": metadata,
    }


def _text(content: Any) -> str:
    """A message's content as text (a list of text parts joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _agent_step(message: dict[str, Any], reasoning: bool) -> dict[str, Any]:
    step: dict[str, Any] = {"source": "agent", "message": _text(message.get("content"))}
    if reasoning and message.get("reasoning_content"):
        step["reasoning_content"] = message["reasoning_content"]
    calls = [
        {
            "tool_call_id": c.get("id"),
            "function_name": (c.get("function") or {}).get("name"),
            "arguments": _arguments((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
    ]
    if calls:
        step["tool_calls"] = calls
    return step


def _arguments(text: Any) -> dict[str, Any]:
    """ATIF arguments are an object: the parsed JSON, else the raw text under ``raw``."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"raw": text}


def _observe(steps: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """A tool message becomes a result of the agent step that made the call."""
    result = {"source_call_id": message.get("tool_call_id"), "content": _text(message.get("content"))}
    for step in reversed(steps):
        if step["source"] == "agent" and any(
            c["tool_call_id"] == result["source_call_id"] for c in step.get("tool_calls", [])
        ):
            step.setdefault("observation", {"results": []})["results"].append(result)
            return
    steps.append({"source": "system", "message": "", "observation": {"results": [result]}})


def _metrics(step: dict[str, Any]) -> dict[str, Any]:
    """ATIF metrics of one model call from its StepFinished tokens (OpenCode's split)."""
    return {
        "prompt_tokens": step["tokens_input"] + step["tokens_cache_read"],
        "completion_tokens": step["tokens_output"] + step["tokens_reasoning"],
        "cached_tokens": step["tokens_cache_read"],
        "cost_usd": step["cost"],
    }


def _final_metrics(steps: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [s["metrics"] for s in steps if "metrics" in s]
    return {
        "total_prompt_tokens": sum(m["prompt_tokens"] for m in measured),
        "total_completion_tokens": sum(m["completion_tokens"] for m in measured),
        "total_cached_tokens": sum(m["cached_tokens"] for m in measured),
        "total_cost_usd": float(sum(m["cost_usd"] for m in measured)),
        "total_steps": len(steps),
    }


def _sample_text(conv: PathConversation, reasoning: bool) -> int:
    """The characters of a sample's text: contents, reasoning, calls' names and arguments, tools' JSON."""
    total = len(json.dumps(conv.tools, ensure_ascii=False))
    for m in [*conv.system, *conv.messages]:
        total += len(_text(m.get("content"))) + (len(m.get("reasoning_content") or "") if reasoning else 0)
        for c in m.get("tool_calls") or []:
            function = c.get("function") or {}
            total += len(function.get("name") or "") + len(_text(function.get("arguments")))
    return total


class Lengths:
    """Each sample's length for the manifest: characters, and tokens with a tokenizer.

    ``tokenizer`` is a local Hugging Face tokenizer directory (``transformers``, the
    ``train`` extra); its chat template renders the sample as a trainer does, with
    the tools, and the rendering's tokens are counted.
    """

    def __init__(self, tokenizer: str | None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.tokenizer = _load_tokenizer(tokenizer) if tokenizer else None
        self.name = tokenizer

    def add(self, file: str, path: dict[str, Any], conv: PathConversation, reasoning: bool) -> None:
        row = {
            "file": file,
            "tree_id": path["tree_id"],
            "leaf_id": path["leaf_id"],
            "chars": _sample_text(conv, reasoning),
        }
        if self.tokenizer is not None:
            messages = [*conv.system, *conv.messages]
            if not reasoning:
                messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
            try:
                ids = self.tokenizer.apply_chat_template(messages, tools=conv.tools, tokenize=True)
            except Exception as err:  # a template error names the sample, not a traceback
                raise InputError(
                    f"--tokenizer {self.name}: its chat template cannot render the sample of "
                    f"{path['tree_id']} {path['leaf_id']} ({err})"
                ) from err
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            row["tokens"] = len(ids)
        self.rows.append(row)

    def manifest(self) -> dict[str, Any]:
        """``lengths`` (one row per sample, in file order) and their maxima."""
        out: dict[str, Any] = {
            "lengths": self.rows,
            "tokenizer": self.name,
            "max_chars": max((r["chars"] for r in self.rows), default=0),
        }
        if self.tokenizer is not None:
            out["max_tokens"] = max((r["tokens"] for r in self.rows), default=0)
        return out


def _load_tokenizer(directory: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise InputError("--tokenizer needs transformers: pip install -e '.[train]'") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # any loading problem is the directory's
        raise InputError(f"--tokenizer {directory}: not a local tokenizer directory ({err})") from err
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"--tokenizer {directory}: the tokenizer has no chat template to render samples with")
    return tokenizer
