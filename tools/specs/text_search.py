"""text_search: the web searched with a text query (``tools.search``; results cached by query)."""

from __future__ import annotations

from typing import Any

from edge_agent.tools.specs.base import MAX_QUERY_CHARS, STR_CHAR, ActionError, ToolSpec, call_head

NAME = "text_search"


def _grammar(n_images: int) -> str:
    return "\n".join([
        'root ::= query "\\""',
        # the first char is not a space either: a query starts with a word
        "query ::= " + STR_CHAR[:-1] + " ]" + f" {STR_CHAR}{{0,{MAX_QUERY_CHARS - 1}}}",
    ])


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
    check=_check,
    plan_verbs=(r"(?:search(?:ing)?|text_search|look(?:ing)? (?:it |this |that )?up|google|query|browse|"
                r"find (?:out|information|more)|check (?:online|the web))"),
    can_do="search by text",
    cache_kind="text_search",
    prompt_rank=20,
    library_rank=20,
)
