"""answer: the final answer, ``<answer>...</answer>`` (the end of the episode: nothing follows it)."""

from __future__ import annotations

from edge_agent.tools.specs.base import ToolSpec, gbnf_literal

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def _grammar(n_images: int) -> str:
    # any text without "<" (no chat-format tag can start inside the answer), then the close tag
    return f"root ::= [^<]* {gbnf_literal(ANSWER_CLOSE)}"


SPEC = ToolSpec(
    action="answer",
    name="",
    schema=None,
    head=ANSWER_OPEN,
    tail_stop="<",
    tail_rest="/answer>",
    tail_grammar=_grammar,
    check=None,
    plan_verbs=(r"(?:answer|respond|reply|say|give (?:the|my|a|your) (?:final )?answer|provide (?:the|an|my) "
                r"answer|conclude)"),
    prompt_rank=100,
    library_rank=100,
)
