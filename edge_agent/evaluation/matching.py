"""Answer matching: SQuAD-style normalisation, exact match and word-boundary containment.

Knows: text. Does not know: question sets, events or metrics.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "“”‘’«»…–—"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # the comma of "2,925" ("1,2" stays two numbers)


def normalize_answer(text: str) -> str:
    """Lower case, accents folded ("Bolívar" = "Bolivar"), thousands separators dropped ("2,925" = "2925"),
    punctuation to spaces, articles dropped, whitespace collapsed (SQuAD-style)."""
    text = "".join(c for c in unicodedata.normalize("NFKD", str(text)) if not unicodedata.combining(c))
    text = _THOUSANDS.sub("", text).lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def match_answer(prediction: str, answers: Iterable[str]) -> tuple[bool, bool]:
    """(exact, contains): normalised prediction equals / contains (on word boundaries) any answer."""
    pred = normalize_answer(prediction)
    exact = contains = False
    for a in answers:
        gold = normalize_answer(a)
        if not gold:
            continue
        if pred == gold:
            exact = contains = True
            break
        if f" {gold} " in f" {pred} ":
            contains = True
    return exact, contains

