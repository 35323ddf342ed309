"""What a tool is, one :class:`ToolSpec` per module of this package (``edge_agent.tools.specs``).

Knows: every fact about one move that the rest of the code reads: the name the model writes, its JSON
schema in the system prompt, the fixed head of a call, the grammar of its free values and the fixed rest,
how its arguments are checked, the words with which a reasoning states it, the phrase "what is still
possible" uses, whether it needs an image, whether it is a search (whose results the search cache keeps
under its kind) and where it stands in the prompt and in a built library. Also the GBNF pieces the
tools' grammars share, and :class:`ActionError`. Does not know: models, tokens, the loop, the network.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Upper bounds that keep a random or confused model from running on (chars, not tokens).
MAX_LABEL_CHARS = 40
MAX_QUERY_WORDS = 8  # a query's words (each at most 24 chars): text_search's grammar
MAX_IMAGES_IN_GRAMMAR = 100

# GBNF pieces. A JSON string char: no quote, backslash, control char, "<" (which could start a
# chat-format tag) or brace (a tail's stop); coordinates are integers 0-1000 without leading zeros.
STR_CHAR = r'[^"\\<{}\x00-\x1F]'
COORD = 'coord ::= "0" | [1-9] | [1-9] [0-9] | [1-9] [0-9] [0-9] | "1000"'
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "}}\n</tool_call>"


class ActionError(ValueError):
    """The model's action cannot be used; ``str(e)`` is the observation it will read."""


def gbnf_literal(s: str) -> str:
    return json.dumps(s)  # JSON string escapes (\n, \", \\) are valid GBNF literal escapes


def idx_rule(n_images: int) -> str:
    """GBNF ``idx``: an image index among the images that exist (at most MAX_IMAGES_IN_GRAMMAR)."""
    n = max(1, min(n_images, MAX_IMAGES_IN_GRAMMAR))
    return "idx ::= " + " | ".join(f'"{i}"' for i in range(n))


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def call_head(name: str, first_argument: str) -> str:
    """The fixed start of a call, up to its first free value: ``<tool_call>\\n{"name": "NAME", "arguments":
    {...``."""
    return f'{TOOL_OPEN}\n{{"name": "{name}", "arguments": {{{first_argument}'


@dataclass(frozen=True, eq=False)
class ToolSpec:
    """One move the model can make: a tool it calls, or the answer (``name`` empty, no schema).

    An action is written in parts: the fixed ``head`` (appended, never decoded), a tail decoded under
    ``tail_grammar(n_images)`` (its grammar ends with ``tail_stop`` + ``tail_rest``), and the fixed rest.
    Generation stops at ``tail_stop`` (right after the last free value); the rest is appended, less what
    the token that brought the stop held of it (``agent.actions.tail_remainder``): the grammar admits the
    model's own closing token, which for the real Qwen carries more than the stop (a query closes with
    `"}}` at p 0.94, `"` alone under 0.001; an answer with `</` or `.</`). With a grammar that ended at
    the stop, that token was masked and the 1.5B wrote on ("capital of Mongolia web search results for
    capital") until the word cap.
    """

    action: str  # the move's short name (rationales, events, the trace): "zoom"
    name: str  # what the model writes as the function's name ("image_zoom_in_tool"); "" for the answer
    schema: Mapping[str, Any] | None  # the function's schema as the system prompt lists it (None: the answer)
    head: str
    tail_stop: str
    tail_rest: str
    tail_grammar: Callable[[int], str]  # GBNF of what follows the head, given the number of images
    check: Callable[[dict[str, Any]], dict[str,
                                           Any]] | None  # a call's arguments, checked (raises ActionError)
    plan_verbs: str  # regex: the verbs with which a reasoning states this move next (agent.intent)
    can_do: str = ""  # in "You can still ... or answer.": "zoom into the image" ("" for the answer)
    # offered only to a model that reads images, usable only with an image attached;
    needs_image: bool = False
    # a rationale implying it needs an image unless its library says otherwise
    cache_kind: str | None = None  # a search: the kind the search cache keeps its results under (tools.cache)
    per_image: bool = False  # a search keyed by image (not by query): withdrawn once every image was searched
    prompt_rank: int = 50  # where its schema stands among the prompt's tools (and the name grammar, can_do)
    library_rank: int = 50  # where its rationales stand in a library that `library build` writes
    run: Callable[[Mapping[str, Any]], str] | None = None  # a tool needing nothing of the question: the
    # observation for its arguments (the toolbox runs the image and search tools itself)
    # True once the tail decoded so far has begun past the last part its value may hold (a query's ninth
    # word): the loop takes that last token back and closes the value (``tail_stop`` + ``tail_rest``).
    # The grammar admits the start of that part, so the model's own token for it is sampled and seen, not
    # masked into a continuation of the part before ("became" + "Independent").
    tail_cut: Callable[[str], bool] | None = None

    @property
    def is_tool(self) -> bool:
        """A function the model calls (every move but the answer)."""
        return bool(self.name)

    @property
    def is_search(self) -> bool:
        return self.cache_kind is not None

    def head_rest(self) -> str:
        """What follows ``<tool_call>\\n{"name": "NAME"`` in the head of a tool's call."""
        return self.head[self.head.index(self.name) + len(self.name) + 1:]
