"""Actions: their exact text, the GBNF grammars that force them, and parsing.

Knows: the four action types (zoom, text_search, image_search, answer) and how each is written::

    <tool_call>\\n{"name": "image_zoom_in_tool",
                   "arguments": {"bbox_2d": [x1, y1, x2, y2], "label": "...", "img_idx": N}}\\n</tool_call>
    <tool_call>\\n{"name": "text_search", "arguments": {"query": "..."}}\\n</tool_call>
    <tool_call>\\n{"name": "image_search", "arguments": {"img_idx": N}}\\n</tool_call>
    <answer>...</answer>

An action is produced in parts: a fixed **head** (everything up to the first free value, e.g.
``<tool_call>\\n{"name": "text_search", "arguments": {"query": "``), a **tail** generated under a
grammar up to the end of the last free value, and the fixed **rest** (``"}}\\n</tool_call>``).
Fixed text is appended (prefill costs a fraction of decoding it); only free values are decoded.
In SSR mode the chosen rationale fixes the type, so the whole head is appended; in free-form
mode the model first chooses under :data:`CHOICE_GRAMMAR` (``<answer>`` or ``<tool_call>``) and
:func:`name_grammar` (which tool). Either way the context holds the same text, and every action
parses.

Each move is defined once, in its module of ``edge_agent.tools.specs`` (name, schema, head, tail grammar,
rest, argument check); this module assembles them: the heads and tails by move, the free-form choice
grammars, and the parser. Does not know: models, tokens, tools' behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_agent.tools import specs
from edge_agent.tools.specs.answer import ANSWER_CLOSE, ANSWER_OPEN
from edge_agent.tools.specs.base import (
    MAX_IMAGES_IN_GRAMMAR,
    MAX_LABEL_CHARS,
    MAX_QUERY_WORDS,
    TOOL_CLOSE,
    TOOL_OPEN,
    ActionError,
    ToolSpec,
)

__all__ = ["CHOICE_GRAMMAR", "CHOICE_STOP", "HEADS", "MAX_IMAGES_IN_GRAMMAR", "MAX_LABEL_CHARS",
           "MAX_QUERY_WORDS",
           "NAME_PREFIX", "TAIL_REST", "TAIL_STOP", "TOOL_CLOSE", "Action", "ActionError", "ToolCall",
           "head_rest",
           "name_grammar", "parse_action", "tail_cut", "tail_grammar", "tail_remainder", "validate_arguments"]


class _ByAction(Mapping[str, str]):
    """One text of every move, by its action, read from the registry when asked (a tool a test adds shows)."""

    def __init__(self, text: Callable[[ToolSpec], str]) -> None:
        self._text = text

    def __getitem__(self, action: str) -> str:
        return self._text(specs.by_action(action))

    def __iter__(self) -> Iterator[str]:
        return iter([s.action for s in specs.all_specs()])

    def __len__(self) -> int:
        return len(specs.all_specs())


HEADS: Mapping[str, str] = _ByAction(lambda s: s.head)
# A tail's generation stops at its stop string, right after the last free value; the rest of the
# action is fixed and is appended (prefilled) instead of decoded token by token. The grammar admits
# the whole rest, so the token that brings the stop may carry some of it (the real Qwen closes a query
# with `"}}`): only what it did not bring is appended (tail_remainder).
TAIL_STOP: Mapping[str, str] = _ByAction(lambda s: s.tail_stop)
TAIL_REST: Mapping[str, str] = _ByAction(lambda s: s.tail_rest)

# Free-form mode chooses its action in two small steps (see the loop's _head): the tag, then the
# tool's name; everything else of the head is fixed and prefilled.
CHOICE_GRAMMAR = f'root ::= "{ANSWER_OPEN}" | "{TOOL_OPEN}"'
CHOICE_STOP = ">"
NAME_PREFIX = '\n{"name": "'  # after "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str  # what the model wrote: image_zoom_in_tool | text_search | image_search | ...
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def action(self) -> str:
        spec = specs.by_name(self.name)
        if spec is None:
            raise KeyError(self.name)
        return spec.action


@dataclass(frozen=True)
class Action:
    type: str  # zoom | text_search | image_search | answer | another registered move
    call: ToolCall | None = None
    answer: str | None = None


def tail_grammar(action: str, *, n_images: int = 1) -> str:
    """GBNF for what follows ``HEADS[action]``, ending with ``TAIL_STOP[action] + TAIL_REST[action]``.

    ``img_idx`` is limited to the images that exist.
    """
    try:
        spec = specs.by_action(action)
    except KeyError:
        raise ValueError(f"unknown action {action!r}") from None
    return spec.tail_grammar(n_images)


def tail_remainder(action: str, last_piece: str) -> str:
    """What to append after a tail whose generation stopped at ``TAIL_STOP[action]``: the stop and
    ``TAIL_REST[action]``, less what its last token (``last_piece``, the token that brought the stop) holds of
    them: `"}}` leaves ``\n</tool_call>``, `.</` leaves ``answer>``."""
    stop, rest = TAIL_STOP[action], TAIL_REST[action]
    i = last_piece.find(stop)
    held = last_piece[i:] if i >= 0 else stop
    return (stop + rest)[len(held):] if (stop + rest).startswith(held) else rest


def tail_cut(action: str) -> Callable[[str], bool] | None:
    """Whether a tail decoded so far went past its value's end (``ToolSpec.tail_cut``); None: the
    grammar alone bounds it."""
    return specs.by_action(action).tail_cut


def name_grammar(actions: Collection[str]) -> str:
    """GBNF for the tool name (and its closing quote) among the allowed tool actions."""
    names = [json.dumps(s.name) for s in specs.tools() if s.action in actions]
    if not names:
        raise ValueError("no allowed tools")
    return "root ::= (" + " | ".join(names) + ') "\\""'


def head_rest(action: str) -> str:
    """What follows ``<tool_call>\n{"name": "NAME"`` in the head of a tool action."""
    return specs.by_action(action).head_rest()


def parse_action(text: str) -> Action:
    """Parse a complete action (head + tail). Raises ActionError with a message for the model."""
    t = text.strip()
    if t.startswith(ANSWER_OPEN):
        body = t[len(ANSWER_OPEN):]
        if body.endswith(ANSWER_CLOSE):
            body = body[: -len(ANSWER_CLOSE)]
        return Action("answer", answer=body.strip())
    if not t.startswith(TOOL_OPEN):
        raise ActionError("Write either <tool_call>{json}</tool_call> or <answer>...</answer>.")
    body = t[len(TOOL_OPEN):]
    if not body.rstrip().endswith("</tool_call>"):
        raise ActionError("The tool call was cut off before </tool_call>; write a shorter call.")
    body = body.rstrip()[: -len("</tool_call>")].strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ActionError(f"The tool call is not valid JSON ({e.msg}).") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"),
                                                   str) or not isinstance(obj.get("arguments", {}), dict):
        raise ActionError('A tool call must be {"name": "...", "arguments": {...}}.')
    name, args = obj["name"], obj.get("arguments", {})
    spec = specs.by_name(name)
    if spec is None:
        raise ActionError(f"Unknown tool {name!r}; the tools are {', '.join(s.name for s in specs.tools())}.")
    return Action(spec.action, call=ToolCall(name, validate_arguments(name, args)))


def validate_arguments(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Check types of the arguments (values such as the box are repaired by the tool itself)."""
    spec = specs.by_name(name)
    if spec is None or spec.check is None:
        raise ActionError(f"Unknown tool {name!r}.")
    return spec.check(args)
