"""answer: the final answer, ``<answer>...</answer>`` (the end of the episode: nothing follows it)."""

from __future__ import annotations

from edge_agent.tools.specs.base import ToolSpec, gbnf_literal

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def _grammar(n_images: int) -> str:
    # Any text that does not begin with "{" (an answer is prose: free-form's 1.5B, having reasoned "I'll use
    # the multiplication function", wrote `{"name": "multiply", "arguments": {"a": 12, "b": 34}}` as its
    # answer to "What is 12*34?" in 3 of the 13 known dev questions), then the close tag. A "<" inside is
    # followed by neither a letter, "/" nor "|" (after any further "<"): no chat-format tag can start inside
    # the answer (every special token's text begins "<|", "</" or "<" and a letter, so none can be
    # sampled there), and "</" is the close's start (``tail_stop``); "if n <= 1", "x < 5", "a << 2" are
    # text (with no "<" at all, `if n` was where the 1.5B's prime test ended).
    return (f"root ::= [ \\t\\n]* (first char*)? {gbnf_literal(ANSWER_CLOSE)}\n"
            f"first ::= [^<{{ \\t\\n] | lt\n{_CHARS}")


_CHARS = 'char ::= [^<] | lt\nlt ::= "<" ([^a-zA-Z/|<] | lt)'
# the rest of an answer whose start (the answer check's tokens) ended in "<": a character that may follow one
AFTER_LT = f"root ::= ([^a-zA-Z/|<] | lt) char* {gbnf_literal(ANSWER_CLOSE)}\n{_CHARS}"


SPEC = ToolSpec(
    action="answer",
    name="",
    schema=None,
    head=ANSWER_OPEN,
    tail_stop="</",
    tail_rest="answer>",
    tail_grammar=_grammar,
    check=None,
    plan_verbs=(r"(?:answer|respond|reply|say|give (?:the|my|a|your) (?:final )?answer|provide (?:the|an|my) "
                r"answer|conclude)"),
    prompt_rank=100,
    library_rank=100,
)
