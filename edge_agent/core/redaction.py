"""Keeping API keys out of text: the one secret scrubber (HTTP messages, search results, stored chats).

Knows: the forms a key takes in text (as typed, URL-encoded with ``%XX`` or ``+``, or any value of a
``key=`` / ``token=`` query parameter). Does not know: where the text came from or where it goes.
Imports nothing beyond the standard library, so every layer can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MIN_SECRET_CHARS = 4  # shorter "secrets" are not keys; replacing them would mangle ordinary text

_KEY_PARAM = re.compile(
    r"(?<![A-Za-z0-9])((?:api[_-]?key|apikey|key|token|access[_-]?token|subscription[_-]?token)=)"
    r"[^&\s\"'<>#]+",
    re.IGNORECASE,
)


def usable(secrets: Iterable[str]) -> tuple[str, ...]:
    """The secrets worth looking for (non-empty, at least :data:`MIN_SECRET_CHARS` long)."""
    return tuple(s for s in secrets if s and len(s) >= MIN_SECRET_CHARS)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (raw, URL-encoded, or as a ``key=...`` query parameter) replaced by ***.

    Cheap (a few ``str.replace`` and one regex); run it on anything that may be logged, stored or shown.
    """
    if not text:
        return text
    for s in usable(secrets):
        for form in {s, quote(s, safe=""), quote_plus(s)}:
            text = text.replace(form, "***")
    return _KEY_PARAM.sub(r"\1***", text)


def redact_tree(data: Any, secrets: Iterable[str]) -> Any:
    """Every string (dict keys included) in JSON-like ``data``, redacted; tuples come back as lists.

    Unchanged when there is no usable secret. Rewrites lists and dicts in place (pass data you own,
    such as freshly parsed JSON or ``Event.to_json()``). Iterative: deep JSON cannot overflow the stack.
    """
    secrets = usable(secrets)
    if not secrets:
        return data
    root = [data]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, k = stack.pop()
        v = parent[k]
        if isinstance(v, str):
            parent[k] = redact(v, secrets)
        elif isinstance(v, list | tuple):
            v = parent[k] = list(v)
            stack.extend((v, i) for i in range(len(v)))
        elif isinstance(v, dict):
            new = {redact(key, secrets) if isinstance(key, str) else key: val for key, val in v.items()}
            parent[k] = new
            stack.extend((new, key) for key in new)
    return root[0]
