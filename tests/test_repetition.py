"""A degenerate loop at the end of a generation (``agent.repetition``): pure logic on token ids, with a
table of piece texts standing in for a tokenizer."""

from __future__ import annotations

import pytest

from edge_agent.agent.repetition import MIN_SPAN, looping, repeating_unit

PIECES = {1: " Nana", 2: " N", 3: "ana", 4: "0", 5: "|", 6: "---", 7: " The", 8: " anthem", 9: " is", 10: ".",
          11: " Oye", 12: ",", 13: " Ghana", 14: "!", 15: " la"}


def detok(ids) -> str:
    return "".join(PIECES[i] for i in ids)


@pytest.mark.parametrize("tokens, unit", [
    ([7, 8, 9] + [1] * MIN_SPAN, (1,)),  # one token, 16 times
    ([7, 8, 9] + [2, 3] * 8, (2, 3)),  # " N" "ana": " Nana" in two tokens, 8 times
    ([7, 8, 9] + [11, 12, 13, 14] * 4, (11, 12, 13, 14)),  # " Oye, Ghana!" four times
    ([7, 8, 9, 10] * 4 + [7, 8, 9, 10] * 1, (7, 8, 9, 10)),  # a sentence again and again
])
def test_a_unit_repeated_back_to_back_is_a_loop(tokens, unit):
    assert repeating_unit(tokens) == unit
    assert looping(tokens, detok)


@pytest.mark.parametrize("tokens", [
    [7, 8, 9] + [1] * (MIN_SPAN - 1),  # one short of the span
    [7, 8, 9] + [11, 12, 13, 14] * 3,  # three times only
    [7, 8, 9] + [2, 3] * 7 + [2],  # 15 tokens of the loop
    [7, 8, 9] + [2, 3] * 6 + [3, 2] + [2, 3],  # broken in the middle
    [7, 8, 9, 10, 11, 12, 13, 14, 15],  # an ordinary answer
    [],
])
def test_no_loop_short_of_it(tokens):
    assert repeating_unit(tokens) is None and not looping(tokens, detok)


@pytest.mark.parametrize("tokens", [
    [7, 8, 9] + [4] * 24,  # "1000000000000000000000000": digits repeat in honest answers
    [5, 6] * 12,  # a Markdown table's rule
])
def test_a_unit_without_a_letter_is_no_loop(tokens):
    assert repeating_unit(tokens) is not None and not looping(tokens, detok)


def test_the_loop_is_seen_the_token_it_becomes_one():
    """``generate``'s until asks after every token: the stop comes at the first prefix that loops."""
    tokens = [7, 8, 9] + [15] * 40
    first = next(i for i in range(1, len(tokens) + 1) if looping(tokens[:i], detok))
    assert first == 3 + MIN_SPAN
