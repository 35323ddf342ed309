"""The texts the model reads and writes for its moves, pinned against the output captured before the
tools were defined one module each (``tests/snapshots/tool_texts.json``): the system prompt of every set of
tools (with and without an image, the user's instructions, the index-only plans), every grammar (each tail at
1, 3 and 150 images, the tool name among every set of tools, the choice), every head and tail, what parsing
makes of each kind of call and each mistake, and the toolbox's "what is still possible" sentence. The prompt
and grammars must make the same tokens as before: any change here changes what the model sees.

To re-capture after a deliberate change of these texts: ``EDGE_AGENT_PIN=write pytest
tests/test_tool_texts.py``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from edge_agent.agent import actions
from edge_agent.agent.intent import stated_action
from edge_agent.agent.prompts import system_prompt
from edge_agent.agent.rationales import builtin_library, parse_library
from edge_agent.agent.toolbox import Toolbox
from tests.fakes.tools import FakeSearch

PIN = Path(__file__).parent / "snapshots" / "tool_texts.json"
TOOLS = ("zoom", "text_search", "image_search")
CALLS = [
    '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 300, 400], "label": "a '
    'sign", '
    '"img_idx": 0}}\n</tool_call>',
    '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1.5, 2, 3, 4], "label": '
    '7}}\n</tool_call>',
    '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3]}}\n</tool_call>',
    '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4], "img_idx": '
    '"1"}}\n</tool_call>',
    '<tool_call>\n{"name": "text_search", "arguments": {"query": "  eiffel tower height "}}\n</tool_call>',
    '<tool_call>\n{"name": "text_search", "arguments": {"query": ""}}\n</tool_call>',
    '<tool_call>\n{"name": "image_search", "arguments": {"img_idx": 2}}\n</tool_call>',
    '<tool_call>\n{"name": "image_search", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "image_search", "arguments": {"img_idx": true}}\n</tool_call>',
    '<tool_call>\n{"name": "web_fetch", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "text_search", "arguments": {"query": "x"}}',
    '<tool_call>\n{"name": text_search}\n</tool_call>',
    '<tool_call>\n["text_search"]\n</tool_call>',
    "<answer> Paris </answer>",
    "<answer>Paris",
    "Paris",
]


def _subsets(items: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for n in range(len(items) + 1) for c in itertools.combinations(items, n)]


def _parsed(text: str) -> Any:
    try:
        a = actions.parse_action(text)
    except actions.ActionError as e:
        return {"error": str(e)}
    return {"type": a.type, "answer": a.answer,
            "call": None if a.call is None else {"name": a.call.name, "arguments": a.call.arguments,
                                                 "action": a.call.action}}


def _still_possible() -> dict[str, str]:
    out = {}
    for withdrawn in _subsets(TOOLS):
        box = Toolbox(None, FakeSearch())
        box.images = [object()] * 2  # type: ignore[assignment]  # only its length is read here
        box.withdrawn = {a: "test" for a in withdrawn}
        out["-".join(withdrawn) or "none"] = box.still_possible()
    return out


REASONINGS = [
    "I'll search the web for the tower's height.", "Let me zoom in on the sign.",
    "I should do a reverse image search.",
    "I don't need to search: the answer is Paris.", "Searching for the opening hours.",
    "Zoom in on the label.",
    "The search results show the answer.", "I will look it up, then answer.", "First, I crop the corner.",
    "Let me search with the image.", "I know this.", "Nothing to say here.",
]


def _offers() -> dict[str, Any]:
    out = {}
    for vision in (True, False):
        for unconfigured in ((), ("image_search",), ("text_search", "image_search")):
            box = Toolbox(None, FakeSearch(unconfigured_tools={t: "no key" for t in unconfigured}),
                          vision=vision)
            out[f"vision={vision}|unconfigured={'+'.join(unconfigured)}"] = sorted(box.offered_actions())
    return out


def rendered() -> dict[str, Any]:
    """Every pinned text, from the code as it is."""
    prompts = {}
    for tools in _subsets(TOOLS):
        for answer in ((), ("answer",)):
            for has_image in (True, False):
                key = f"{'+'.join(tools + answer) or 'nothing'}|image={has_image}"
                prompts[key] = system_prompt(tools + answer, has_image=has_image)
    prompts["all|extra"] = system_prompt(TOOLS, extra="  Be brief.\n Say <|im_end|> never. ")
    prompts["all|index-only"] = system_prompt(TOOLS + ("answer",), library=builtin_library())
    prompts["answer|text|index-only"] = system_prompt(("answer",), has_image=False, library=builtin_library())
    grammars = {f"{a}|{n}": actions.tail_grammar(a, n_images=n) for a in (*TOOLS, "answer")
                for n in (1, 3, 150)}
    names = {"+".join(tools): actions.name_grammar(tools) for tools in _subsets(TOOLS) if tools}
    return {
        "system_prompt": prompts,
        "tail_grammar": grammars,
        "name_grammar": names,
        "choice": [actions.CHOICE_GRAMMAR, actions.CHOICE_STOP, actions.NAME_PREFIX],
        "heads": dict(actions.HEADS),
        "tail_stop": dict(actions.TAIL_STOP),
        "tail_rest": dict(actions.TAIL_REST),
        "head_rest": {a: actions.head_rest(a) for a in TOOLS},
        "parsed": {text: _parsed(text) for text in CALLS},
        "still_possible": _still_possible(),
        "offered": _offers(),
        "stated": {text: [stated_action(text), stated_action(text, {"text_search", "answer"})]
                   for text in REASONINGS},
        "library": [[r.id, r.action, r.needs_image, r.needs_evidence] for r in builtin_library()],
        "needs_image_by_default": [r.needs_image for r in parse_library(
            {"rationales": [{"id": a, "action": a, "text": "t"} for a in (*TOOLS, "answer", "any")]},
            source="x")],
    }


def test_the_model_reads_and_writes_the_texts_it_did_before_the_tools_were_modules():
    now = rendered()
    if os.environ.get("EDGE_AGENT_PIN") == "write":
        PIN.write_text(json.dumps(now, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    pinned = json.loads(PIN.read_text(encoding="utf-8"))
    for part in pinned:
        assert json.loads(json.dumps(now[part])) == pinned[part], part
    assert now.keys() == pinned.keys()
