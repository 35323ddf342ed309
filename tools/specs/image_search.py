"""image_search: a reverse image search with the image or a crop (``tools.search``; results cached by
image)."""

from __future__ import annotations

from typing import Any

from edge_agent.tools.specs.base import (
    TOOL_CLOSE,
    ActionError,
    ToolSpec,
    call_head,
    gbnf_literal,
    idx_rule,
    is_int,
)

NAME = "image_search"


def _grammar(n_images: int) -> str:
    return "\n".join([f"root ::= idx {gbnf_literal(TOOL_CLOSE)}", idx_rule(n_images)])


def _check(args: dict[str, Any]) -> dict[str, Any]:
    idx = args.get("img_idx", 0)
    if not is_int(idx):
        raise ActionError("image_search needs img_idx as an integer (0 is the original image).")
    return {"img_idx": idx}


SPEC = ToolSpec(
    action="image_search",
    name=NAME,
    schema={
        "type": "function",
        "function": {
            "name": NAME,
            "description": "Reverse image search: find web pages that show this image or crop.",
            "parameters": {
                "type": "object",
                "properties": {"img_idx": {"type": "integer",
                                           "description": "0 is the original, 1.. are crops."}},
                "required": ["img_idx"],
            },
        },
    },
    head=call_head(NAME, '"img_idx": '),
    tail_stop="}",
    tail_rest="}\n</tool_call>",
    tail_grammar=_grammar,
    check=_check,
    plan_verbs=(r"(?:reverse[- ]image[- ]search|search (?:the web )?(?:by|with|using) (?:the |this )?image|"
                r"image[- ]search|search for (?:this|the) image)"),
    can_do="search by image",
    needs_image=True,
    cache_kind="image_search",
    per_image=True,
    prompt_rank=30,
    library_rank=10,
)
