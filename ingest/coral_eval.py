"""The eval result of a rollout turn, from what ``coral eval`` left behind.

The structured source of truth is the attempt JSON that ``coral eval`` writes for
the new commit (``<shared>/attempts/<commit>.json``); when there is none, the
result block it printed in the turn's last shell call that ran it::

    CORAL Eval (#17): 0.8523000000
    Commit:  1a2b3c4d5e6f
    Status:  improved
    Feedback: <text, optional>

The score line reads ``FAILED`` when grading gave no number and ``PENDING`` when it
did not finish; ``CORAL Eval: STILL PENDING`` (on stderr, exit 2) is no result block.
Nothing here raises on malformed input: it is no result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ingest.opencode_stream import ShellCall
from ingest.snapshots import numeric_score

# The count "(#17)" is left out when CORAL reads its counter as 0, which it does when it
# reads the file while the daemon rewrites it.
EVAL_BLOCK = re.compile(
    r"CORAL Eval(?: \(#\d+\))?:\s*(\S+)\s*\nCommit:\s*(\S+)\s*\nStatus:\s*(\S+)(?:\s*\nFeedback:\s*(.*))?"
)


@dataclass(frozen=True)
class EvalResult:
    """A turn's eval: the score (None when no number came back), status, feedback, source."""

    score: float | None
    status: str | None
    feedback: str | None
    source: str  # attempt_json, printed_block or none

    @property
    def error(self) -> str | None:
        """What went wrong, when no number came back: the feedback's first line (at most 500 characters)."""
        if self.score is not None or not self.feedback:
            return None
        first = next((line.strip() for line in self.feedback.splitlines() if line.strip()), None)
        return first[:500] if first else None


NO_EVAL = EvalResult(None, "no_eval", None, "none")


def from_attempt(path: Path) -> EvalResult | None:
    """The result an attempt JSON holds, or None if it is missing or unusable."""
    try:
        attempt = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON
        return None
    if not isinstance(attempt, dict):
        return None
    score, _ = numeric_score(attempt.get("score"))
    status = attempt.get("status")
    feedback = attempt.get("feedback")
    return EvalResult(
        score,
        status if isinstance(status, str) else None,
        feedback if isinstance(feedback, str) else None,
        "attempt_json",
    )


def runs_eval(call: ShellCall, eval_word: str) -> bool:
    """Whether a shell call ran the eval command (its first word anywhere in the command)."""
    return eval_word in call.command


def eval_seconds(calls: list[ShellCall], eval_word: str) -> float | None:
    """How long the turn's completed eval commands ran; None when none was timed."""
    found = [call.seconds for call in calls if runs_eval(call, eval_word) and call.seconds is not None]
    return round(sum(found), 3) if found else None


def from_printed(calls: list[ShellCall], eval_word: str) -> EvalResult | None:
    """The last result block printed by a shell call that ran the eval command."""
    last = None
    for call in calls:
        if runs_eval(call, eval_word):
            found = EVAL_BLOCK.findall(call.output)
            if found:
                last = found[-1]
    if last is None:
        return None
    raw, _commit, status, feedback = last
    try:
        score, _ = numeric_score(float(raw))
    except ValueError:  # FAILED, PENDING
        score = None
    return EvalResult(score, status, feedback or None, "printed_block")
