"""Model text made safe to print, store and render: C0/C1 control characters removed.

A small or random-weight model can emit any byte its vocabulary holds (``\\x04``, ``\\x1b[2J``,
``\\x9b``); written to a terminal those move the cursor or change colours, and in a file they are
invisible junk. :func:`clean_model_text` drops every C0 control (U+0000-U+001F) except newline and
tab, DEL (U+007F) and every C1 control (U+0080-U+009F); nothing else changes (other Unicode, including
emoji and right-to-left text, stays). :func:`clean_event` applies it to the model-written fields of an
agent event. Used where model text leaves the engine (``Engine.ask``), where chats are stored and
exported (``edge_agent.chat.store``), and by the app's rendering and the eval's predictions.

Does not know: search results (``tools.text.clean_text`` makes web text one printable line), widgets.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

# C0 minus \t (0x09) and \n (0x0a); DEL; C1
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

E = TypeVar("E")

# event field -> cleaned; every field of these events that holds text the model wrote
_MODEL_TEXT_FIELDS = ("text", "answer", "accepted_text", "observation", "message", "question")


def clean_model_text(text: str) -> str:
    """``text`` without C0/C1 control characters (newline and tab kept); a clean text is returned as is."""
    return _CONTROLS.sub("", text) if _CONTROLS.search(text) else text


def _clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return clean_model_text(value)
    if isinstance(value, dict):
        return {clean_model_text(k) if isinstance(k, str) else k: _clean_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clean_value(v) for v in value)
    return value


def clean_event(event: E) -> E:
    """``event`` (a frozen agent event) with control characters removed from its text fields and from
    tool-call arguments; the same object when there was nothing to remove."""
    if not dataclasses.is_dataclass(event) or isinstance(event, type):
        return event
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name in _MODEL_TEXT_FIELDS and isinstance(value, str):
            cleaned = clean_model_text(value)
        elif f.name == "arguments" and isinstance(value, dict):
            cleaned = _clean_value(value)
        elif f.name == "candidates" and isinstance(value, tuple):
            cleaned = tuple(clean_event(c) for c in value)
        else:
            continue
        if cleaned != value:
            changes[f.name] = cleaned
    return dataclasses.replace(event, **changes) if changes else event  # type: ignore[type-var]
