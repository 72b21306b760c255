"""Before the first turn: the model endpoint answers the run's model.

A run whose endpoint is down, or serves another model, would otherwise spend every
turn waiting out its timeout with nothing done (hours at the documented settings).
So the backend asks the endpoint for one token of the run's model, as OpenCode asks
(``POST <endpoint>/chat/completions``, streamed, the run's key), and refuses to start
unless a finished answer comes back. Nothing is recorded: the check passes or the
command ends with the reason, before any turn and before a new run exists.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from engine.teachers.opencode.recorder import parse_answer
from ingest.errors import ProjectError

CHECK_LIMIT_S = 300.0  # the longest a check waits for the answer (a loaded server queues it)
MAX_ANSWER = 1 << 20


def check_endpoint(endpoint: str, model: str, key: str, timeout_s: float) -> None:
    """Raise ProjectError unless ``endpoint`` gives a finished answer from ``model`` within ``timeout_s``."""
    url = urlsplit(endpoint.rstrip("/"))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with OK."}],
        "max_tokens": 1,
        "stream": True,
    }
    if any(c in key for c in "\r\n\0"):  # a header could not carry it; never echo it
        raise ProjectError(
            "the API key (the variable api_key_env names) holds a line break or a NUL: "
            "no request could carry it - remove it from the variable"
        )
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    timeout_s = min(timeout_s, CHECK_LIMIT_S)
    try:
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("not an http(s) URL")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = kind(url.hostname, url.port, timeout=timeout_s)
        try:
            conn.request("POST", f"{url.path}/chat/completions", body=json.dumps(body), headers=headers)
            answer = conn.getresponse()
            raw = answer.read(MAX_ANSWER)
        finally:
            conn.close()
    except TimeoutError:
        why = f"no answer within {timeout_s:.0f} s"
    except ValueError as err:  # a port that is not a number, a URL with no host (never the key: checked above)
        why = f"the endpoint is not usable ({err})"
    except (OSError, http.client.HTTPException) as err:
        why = f"cannot reach it ({getattr(err, 'strerror', None) or err or type(err).__name__})"
    else:
        if answer.status >= 400:
            why = f"it answered HTTP {answer.status}: {_message(raw)}"
        elif parse_answer(raw) is None:
            why = f"it answered without a completion: {_message(raw)}"
        else:
            return
    raise ProjectError(
        f"the model endpoint {endpoint} does not answer for model {model!r}: {why} - start the "
        "model server, or fix --endpoint and --model (backend_options.endpoint and .model); no turn ran"
    )


def _message(raw: bytes) -> str:
    """An answer's error message (an OpenAI-style error body), else its first 200 characters."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict):
        error = found.get("error")
        message = error.get("message") if isinstance(error, dict) else error or found.get("message")
        if isinstance(message, str) and message:
            return message[:200]
    return text[:200] or "(an empty body)"
