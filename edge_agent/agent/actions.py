"""Actions: their exact text, the GBNF grammars that force them, and parsing.

Knows: the four action types (zoom, text_search, image_search, answer) and how each is written::

    <tool_call>\\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2], "label": "...", "img_idx": N}}\\n</tool_call>
    <tool_call>\\n{"name": "text_search", "arguments": {"query": "..."}}\\n</tool_call>
    <tool_call>\\n{"name": "image_search", "arguments": {"img_idx": N}}\\n</tool_call>
    <answer>...</answer>

An action is produced in two parts: a fixed **head** (everything up to the first free value, e.g.
``<tool_call>\\n{"name": "text_search", "arguments": {"query": "``) and a **tail** generated under a
grammar. In SSR mode the chosen rationale fixes the type, so the head is simply appended (prefill
is ~10x cheaper than decoding it) and only the tail is generated; in free-form mode the model
generates the head under :func:`head_grammar` (which admits the head of every allowed action) and
the tail as in SSR. Either way the text in the context is the same, and every action parses.

Does not know: models, tokens, tools' behaviour.
"""

from __future__ import annotations

import json
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

# GBNF pieces. A JSON string char: no quote, backslash, control char, or "<" (which could start a
# chat-format tag); coordinates are integers 0-1000 without leading zeros.
_STR_CHAR = r'[^"\\<\x00-\x1F]'
_COORD = 'coord ::= "0" | [1-9] | [1-9] [0-9] | [1-9] [0-9] [0-9] | "1000"'


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
    """GBNF for what follows ``HEADS[action]``. ``img_idx`` is limited to the images that exist."""
    close = _gbnf_literal(TOOL_CLOSE)
    if action == "zoom":
        return "\n".join([
            f'root ::= coord ", " coord ", " coord ", " coord "], \\"label\\": \\"" label "\\", \\"img_idx\\": " idx {close}',
            _COORD,
            f"label ::= {_STR_CHAR}{{1,{MAX_LABEL_CHARS}}}",
            _idx_rule(n_images),
        ])
    if action == "text_search":
        return "\n".join([
            f'root ::= query "\\"" {close}',
            # the first char is not a space either: a query starts with a word
            "query ::= " + _STR_CHAR[:-1] + " ]" + f" {_STR_CHAR}{{0,{MAX_QUERY_CHARS - 1}}}",
        ])
    if action == "image_search":
        return "\n".join([f"root ::= idx {close}", _idx_rule(n_images)])
    if action == "answer":
        # any text without "<" (no chat-format tag can start inside the answer), then the close tag
        return f"root ::= [^<]* {_gbnf_literal(ANSWER_CLOSE)}"
    raise ValueError(f"unknown action {action!r}")


def head_grammar(actions: set[str] | frozenset[str] | list[str]) -> str:
    """GBNF admitting exactly the head of each allowed action (free-form mode's choice of action)."""
    alts = [_gbnf_literal(HEADS[a]) for a in ("zoom", "text_search", "image_search", "answer") if a in actions]
    if not alts:
        raise ValueError("no allowed actions")
    return "root ::= " + " | ".join(alts)


def action_of_head(text: str) -> str:
    """Which action a generated head starts (the longest head that ``text`` starts with)."""
    for a, h in sorted(HEADS.items(), key=lambda kv: -len(kv[1])):
        if text.startswith(h):
            return a
    raise ActionError(f"Your action must start with one of: {', '.join(repr(h) for h in HEADS.values())}.")


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
