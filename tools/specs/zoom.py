"""zoom: a crop of the image (or of an earlier crop), returned as a new image (``tools.zoom``)."""

from __future__ import annotations

from typing import Any

from edge_agent.tools.specs.base import (
    COORD,
    MAX_LABEL_CHARS,
    STR_CHAR,
    TOOL_CLOSE,
    ActionError,
    ToolSpec,
    call_head,
    gbnf_literal,
    idx_rule,
    is_int,
)

NAME = "image_zoom_in_tool"


def _grammar(n_images: int) -> str:
    return "\n".join([
        'root ::= coord ", " coord ", " coord ", " coord "], \\"label\\": \\"" label "\\", \\"img_idx\\": " '
        f"idx {gbnf_literal(TOOL_CLOSE)}",
        COORD,
        f"label ::= {STR_CHAR}{{1,{MAX_LABEL_CHARS}}}",
        idx_rule(n_images),
    ])


def _check(args: dict[str, Any]) -> dict[str, Any]:
    box = args.get("bbox_2d")
    if not isinstance(box, list) or len(box) != 4 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in box):
        raise ActionError("image_zoom_in_tool needs bbox_2d = [x1, y1, x2, y2] (numbers 0-1000).")
    idx = args.get("img_idx", 0)
    if not is_int(idx):
        raise ActionError("image_zoom_in_tool needs img_idx as an integer (0 is the original image).")
    label = args.get("label", "")
    return {"bbox_2d": box, "label": label if isinstance(label, str) else str(label), "img_idx": idx}


SPEC = ToolSpec(
    action="zoom",
    name=NAME,
    schema={
        "type": "function",
        "function": {
            "name": NAME,
            "description": "Zoom into a region of an image to see small details. The crop is returned as a "
                           "new image.",
            "parameters": {
                "type": "object",
                "properties": {
                    "bbox_2d": {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4,
                                "description": "[x1, y1, x2, y2] in relative coordinates 0-1000."},
                    "label": {"type": "string", "description": "What the region shows."},
                    "img_idx": {"type": "integer",
                                "description": "Image to zoom into: 0 is the original, 1.. are earlier "
                                               "crops."},
                },
                "required": ["bbox_2d", "label", "img_idx"],
            },
        },
    },
    head=call_head(NAME, '"bbox_2d": ['),
    tail_stop="}",
    tail_rest="}\n</tool_call>",
    tail_grammar=_grammar,
    check=_check,
    plan_verbs=(r"(?:zoom(?:ing)?|image_zoom_in_tool|crop(?:ping)?|enlarge|magnify|take a closer look|look "
                r"closer|look more closely)"),
    can_do="zoom into the image",
    needs_image=True,
    prompt_rank=10,
    library_rank=30,
)
