"""Actions: their exact text, the GBNF grammars that force them, and parsing.

Knows: the four action types (zoom, text_search, image_search, answer) and how each is written::

    <tool_call>\\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2], "label": "...", "img_idx": N}}\\n</tool_call>
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

Does not know: models, tokens, tools' behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from edge_agent.agent.prompts import ACTION_OF_TOOL, ANSWER_CLOSE, ANSWER_OPEN, TOOL_NAMES, ZOOM_TOOL

# Upper bounds that keep a random or confused model from running on (chars, not tokens).
MAX_LABEL_CHARS = 40
MAX_QUERY_CHARS = 80
MAX_IMAGES_IN_GRAMMAR = 100

HEADS = {
    "zoom": f'<tool_call>\n{{"name": "{ZOOM_TOOL}", "arguments": {{"bbox_2d": [',
    "text_search": '<tool_call>\n{"name": "text_search", "arguments": {"query": "',
    "image_search": '<tool_call>\n{"name": "image_search", "arguments": {"img_idx": ',
    "answer": ANSWER_OPEN,
}
TOOL_CLOSE = "}}\n</tool_call>"
# Each tail's grammar ENDS with its stop string, right after the last free value; the rest of the
# action is fixed and is appended (prefilled) instead of decoded token by token. Because the
# grammar ends there, the token that completes the stop string cannot carry any further text, so
# the session holds exactly text + stop. (The answer is the end of the episode: nothing follows.)
TAIL_STOP = {"zoom": "}", "image_search": "}", "text_search": '"', "answer": "<"}
TAIL_REST = {"zoom": "}\n</tool_call>", "image_search": "}\n</tool_call>", "text_search": "}}\n</tool_call>",
             "answer": "/answer>"}

# GBNF pieces. A JSON string char: no quote, backslash, control char, "<" (which could start a
# chat-format tag) or brace (a tail's stop); coordinates are integers 0-1000 without leading zeros.
_STR_CHAR = r'[^"\\<{}\x00-\x1F]'
_COORD = 'coord ::= "0" | [1-9] | [1-9] [0-9] | [1-9] [0-9] [0-9] | "1000"'
# Free-form mode chooses its action in two small steps (see the loop's _head): the tag, then the
# tool's name; everything else of the head is fixed and prefilled.
CHOICE_GRAMMAR = 'root ::= "<answer>" | "<tool_call>"'
CHOICE_STOP = ">"
NAME_PREFIX = '\n{"name": "'  # after "<tool_call>"


class ActionError(ValueError):
    """The model's action cannot be used; ``str(e)`` is the observation it will read."""


@dataclass(frozen=True)
class ToolCall:
    name: str  # image_zoom_in_tool | text_search | image_search
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def action(self) -> str:
        return ACTION_OF_TOOL[self.name]


@dataclass(frozen=True)
class Action:
    type: str  # zoom | text_search | image_search | answer
    call: ToolCall | None = None
    answer: str | None = None


def _gbnf_literal(s: str) -> str:
    return json.dumps(s)  # JSON string escapes (\n, \", \\) are valid GBNF literal escapes


def _idx_rule(n_images: int) -> str:
    n = max(1, min(n_images, MAX_IMAGES_IN_GRAMMAR))
    return "idx ::= " + " | ".join(f'"{i}"' for i in range(n))


def tail_grammar(action: str, *, n_images: int = 1) -> str:
    """GBNF for what follows ``HEADS[action]``, ending with ``TAIL_STOP[action]``.

    ``img_idx`` is limited to the images that exist.
    """
    if action == "zoom":
        return "\n".join([
            'root ::= coord ", " coord ", " coord ", " coord "], \\"label\\": \\"" label "\\", \\"img_idx\\": " idx "}"',
            _COORD,
            f"label ::= {_STR_CHAR}{{1,{MAX_LABEL_CHARS}}}",
            _idx_rule(n_images),
        ])
    if action == "text_search":
        return "\n".join([
            'root ::= query "\\""',
            # the first char is not a space either: a query starts with a word
            "query ::= " + _STR_CHAR[:-1] + " ]" + f" {_STR_CHAR}{{0,{MAX_QUERY_CHARS - 1}}}",
        ])
    if action == "image_search":
        return "\n".join(['root ::= idx "}"', _idx_rule(n_images)])
    if action == "answer":
        # any text without "<" (no chat-format tag can start inside the answer), then the close tag
        return f"root ::= [^<]* {_gbnf_literal(ANSWER_CLOSE)}"
    raise ValueError(f"unknown action {action!r}")


def name_grammar(actions: Collection[str]) -> str:
    """GBNF for the tool name (and its closing quote) among the allowed tool actions."""
    names = [_gbnf_literal(TOOL_NAMES[a]) for a in ("zoom", "text_search", "image_search") if a in actions]
    if not names:
        raise ValueError("no allowed tools")
    return "root ::= (" + " | ".join(names) + ') "\\""'


def head_rest(action: str) -> str:
    """What follows ``<tool_call>\n{"name": "NAME"`` in the head of a tool action."""
    head = HEADS[action]
    return head[head.index(TOOL_NAMES[action]) + len(TOOL_NAMES[action]) + 1:]


def parse_action(text: str) -> Action:
    """Parse a complete action (head + tail). Raises ActionError with a message for the model."""
    t = text.strip()
    if t.startswith(ANSWER_OPEN):
        body = t[len(ANSWER_OPEN):]
        if body.endswith(ANSWER_CLOSE):
            body = body[: -len(ANSWER_CLOSE)]
        return Action("answer", answer=body.strip())
    if not t.startswith("<tool_call>"):
        raise ActionError("Write either <tool_call>{json}</tool_call> or <answer>...</answer>.")
    body = t[len("<tool_call>"):]
    if not body.rstrip().endswith("</tool_call>"):
        raise ActionError("The tool call was cut off before </tool_call>; write a shorter call.")
    body = body.rstrip()[: -len("</tool_call>")].strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ActionError(f"The tool call is not valid JSON ({e.msg}).") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments", {}), dict):
        raise ActionError('A tool call must be {"name": "...", "arguments": {...}}.')
    name, args = obj["name"], obj.get("arguments", {})
    if name not in ACTION_OF_TOOL:
        raise ActionError(f"Unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES.values())}.")
    return Action(ACTION_OF_TOOL[name], call=ToolCall(name, validate_arguments(name, args)))


def validate_arguments(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Check types of the arguments (values such as the box are repaired by the tool itself)."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if name == ZOOM_TOOL:
        box = args.get("bbox_2d")
        if not isinstance(box, list) or len(box) != 4 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in box):
            raise ActionError("image_zoom_in_tool needs bbox_2d = [x1, y1, x2, y2] (numbers 0-1000).")
        idx = args.get("img_idx", 0)
        if not is_int(idx):
            raise ActionError("image_zoom_in_tool needs img_idx as an integer (0 is the original image).")
        label = args.get("label", "")
        return {"bbox_2d": box, "label": label if isinstance(label, str) else str(label), "img_idx": idx}
    if name == "text_search":
        q = args.get("query")
        if not isinstance(q, str) or not q.strip():
            raise ActionError("text_search needs a non-empty query string.")
        return {"query": q.strip()}
    if name == "image_search":
        idx = args.get("img_idx", 0)
        if not is_int(idx):
            raise ActionError("image_search needs img_idx as an integer (0 is the original image).")
        return {"img_idx": idx}
    raise ActionError(f"Unknown tool {name!r}.")
