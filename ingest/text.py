"""Text as the log holds it: UTF-8 (:func:`as_utf8`) and the one canonical form of a JSON value.

Light on purpose (no Arrow, no pydantic): a warm read of derived state checks a
run's record with these alone.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> str:
    """The one text of a JSON value that content ids are taken of (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sql_text(value: object) -> str:
    """``value`` as an SQL string literal (its quotes doubled): the one quoting of the project."""
    return "'" + str(value).replace("'", "''") + "'"


def as_utf8(text: str) -> str:
    """``text`` as the log holds text (UTF-8): bytes that are not UTF-8 become U+FFFD.

    A file name holds them as the surrogates Python decodes such bytes to; JSON text
    (a model's output in OpenCode's stream) can hold any lone surrogate as a
    ``\\ud800`` escape, which has no UTF-8 form at all.
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate beyond escaped bytes: pairs joined, lone ones U+FFFD
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
