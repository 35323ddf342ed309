"""text_search: the web searched with a text query (``tools.search``; results cached by query)."""

from __future__ import annotations

from typing import Any

from edge_agent.tools.specs.base import (
    MAX_QUERY_WORDS,
    TOOL_CLOSE,
    ActionError,
    ToolSpec,
    call_head,
    gbnf_literal,
)

NAME = "text_search"


# A query word: a JSON string char that is not a space or a comma (a comma starts a list of queries).
QUERY_WORD = r'[^"\\<{}\x00-\x20,]{1,24}'


def _grammar(n_images: int) -> str:
    """A query of at most MAX_QUERY_WORDS words, one space between them and no commas: on the real 1.5B
    an unbounded query ran to a comma-separated list ("capital of Vietnam, capital city of Vietnam, ...",
    "highest point in X, coordinates, elevation, ...") that cost its tokens and steered the answer.

    The grammar admits the start of one word more, which :func:`_past_last_word` cuts: with the cap in
    the grammar alone, the 1.5B's " independent" after eight words was masked and the best token left
    continued the eighth ("...when it becameIndependent?.")."""
    return "\n".join([
        "root ::= query " + gbnf_literal('"' + TOOL_CLOSE),
        f'query ::= word (" " word){{0,{MAX_QUERY_WORDS}}}',
        f"word ::= {QUERY_WORD}",
    ])


def _past_last_word(text: str) -> bool:
    """Whether the query written so far has begun a word past MAX_QUERY_WORDS (it then ends before it)."""
    return text.count(" ") >= MAX_QUERY_WORDS


def _check(args: dict[str, Any]) -> dict[str, Any]:
    q = args.get("query")
    if not isinstance(q, str) or not q.strip():
        raise ActionError("text_search needs a non-empty query string.")
    return {"query": q.strip()}


SPEC = ToolSpec(
    action="text_search",
    name=NAME,
    schema={
        "type": "function",
        "function": {
            "name": NAME,
            "description": "Search the web with a text query. Returns the top results (title, url, snippet).",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "The search query."}},
                "required": ["query"],
            },
        },
    },
    head=call_head(NAME, '"query": "'),
    tail_stop='"',
    tail_rest="}}\n</tool_call>",
    tail_grammar=_grammar,
    tail_cut=_past_last_word,
    check=_check,
    # "I'll check ..." / "I will verify ...": with no image in sight, the way to check is a search
    plan_verbs=(r"(?:search(?:ing)?|text_search|look(?:ing)? (?:it |this |that )?up|google|query|browse|"
                r"find (?:out|information|more)|(?:check|verify|confirm|double[- ]check)"
                r"(?! (?:the |this |that )?(?:image|photo|picture|crop|zoom)))"),
    can_do="search by text",
    cache_kind="text_search",
    prompt_rank=20,
    library_rank=20,
)
