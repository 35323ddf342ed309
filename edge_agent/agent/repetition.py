"""A degenerate loop at the end of a generation: the same few tokens written again and again.

Knows: what a loop looks like in token ids (the last tokens are one unit of 1..``MAX_PERIOD`` tokens
repeated back to back at least ``MIN_REPEATS`` times, over at least ``MIN_SPAN`` tokens) and that only a
unit holding a letter counts (digits and table rules repeat in honest answers: "1000000000000000",
"|---|---|---|"). A small model answering greedily falls into such loops on what it does not know: asked
"What currency does Ghana use, and what is its national anthem?", the real Qwen2.5-Coder-1.5B wrote
"... The national anthem of Ghana is "Nana Nana Nana ..." to the 256-token cap (11 s). The agent stops the
answer once the loop is plain (``generate``'s ``until``) and says so. Does not know: sessions, models,
events. Pure and cheap: at most ``MAX_PERIOD`` x ``MIN_SPAN``-ish comparisons a token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_PERIOD = 32  # the longest unit (a sentence written again and again)
MIN_REPEATS = 4  # a unit seen this many times back to back ...
MIN_SPAN = 16  # ... over at least this many tokens (a one-token unit: 16 times)


def repeating_unit(tokens: Sequence[int]) -> tuple[int, ...] | None:
    """The unit that the last tokens repeat (the shortest), or None when they are no loop."""
    n = len(tokens)
    for p in range(1, MAX_PERIOD + 1):
        repeats = max(MIN_REPEATS, -(-MIN_SPAN // p))
        span = p * repeats
        if span > n:
            break
        if all(tokens[n - k] == tokens[n - k - p] for k in range(1, span - p + 1)):
            return tuple(tokens[n - p:])
    return None


def looping(tokens: Sequence[int], detokenize: Callable[[Sequence[int]], str]) -> bool:
    """Whether ``tokens`` end in a degenerate loop: a repeating unit (:func:`repeating_unit`) whose text has
    a letter."""
    unit = repeating_unit(tokens)
    return unit is not None and any(c.isalpha() for c in detokenize(unit))


Until = Callable[[Sequence[int], Sequence[float]], bool]  # runtime.types.UntilFn, without importing it


def until_looping(detokenize: Callable[[Sequence[int]], str]) -> Until:
    """``generate``'s ``until`` that ends a generation once it loops (:func:`looping`)."""
    return lambda tokens, _logprobs: looping(tokens, detokenize)


def looped_why(answer: str, then: str = "it searches first") -> str:
    """Why an answer that looped before any tool result is taken back (``MoveWithdrawn.reason``); ``then``:
    what comes instead (``answer_check.then_what``)."""
    words = answer.split()
    shown = " ".join(words[:12]) + (" ..." if len(words) > 12 else "")
    return f"the answer began repeating itself ({shown!r}): the model does not know; {then}"
