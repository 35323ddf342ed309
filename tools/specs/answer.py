"""answer: the final answer, ``<answer>...</answer>`` (the end of the episode: nothing follows it)."""

from __future__ import annotations

from edge_agent.tools.specs.base import ToolSpec, gbnf_literal

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def _grammar(n_images: int) -> str:
    # any text without "<" (no chat-format tag can start inside the answer) that does not begin with "{" (an
    # answer is prose: free-form's 1.5B, having reasoned "I'll use the multiplication function", wrote
    # `{"name": "multiply", "arguments": {"a": 12, "b": 34}}` as its answer to "What is 12*34?" in 3 of
    # the 13 known dev questions), then the close tag
    return f"root ::= [ \\t\\n]* ([^<{{ \\t\\n] [^<]*)? {gbnf_literal(ANSWER_CLOSE)}"


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
