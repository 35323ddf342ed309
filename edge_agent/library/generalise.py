"""One turn's reasoning -> a generic move: the text a rationale library can hold.

Knows: how to find the sentence that commits to the move, and how to generalise it (chat markup,
JSON and box coordinates removed; quoted strings, numbers and proper names replaced or dropped; cut
at a word boundary). Does not know traces, clusters or files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edge_agent.agent.prompts import echoes_instructions
from edge_agent.agent.rationales import FORBIDDEN

DEFAULT_MAX_CHARS = 120  # a rationale is scored on every turn: short ones cost less (see `library show`)
PLACEHOLDER = "it"
_MARKUP = re.compile(
    r"<\|im_start\|>\s*(?:system|user|assistant|tool)?|<\|[^|>]{0,40}\|>"
    r"|</?(?:think|tool_call|tool_response|answer|image|img)[^>]{0,20}>|<\|", re.I)
_JSONISH = re.compile(r"\{[^{}]{0,300}\}")
_BOX = re.compile(r"[\[(]\s*[-+]?\d[\d\s,.;:-]*[\])]")  # [x1, y1, x2, y2], (12, 34)
_QUOTED = re.compile(
    r"\"[^\"\n]{1,120}\"|“[^”\n]{1,120}”|«[^»\n]{1,120}»|(?<![\w])'[^'\n]{1,80}'(?![\w])|`[^`\n]{1,80}`")
_NUMBER = re.compile(r"(?<![\w])[-+]?\d[\d,.:/]*(?:%|st|nd|rd|th|px|x\d+)?(?![\w])")
WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“'(])|\n+")
_DECISION = re.compile(
    r"\b(?:I should|I need to|I need|I will|I'll|I must|I can|I have to|I am going to|I'm going to|"
    r"let me|let's|I want to|the next step|so I|therefore|I'd|it's best to|it is best to|I could)\b", re.I)
# Capitalised words that are not names (sentence-internal capitals a model writes anyway).
_NOT_NAMES = frozenset("""I I'm I'll I've I'd OK Okay Wikipedia Web Internet English""".split())


@dataclass(frozen=True)
class Move:
    """A turn's reasoning reduced to a generic, library-sized text."""

    text: str
    placeholders: int  # specifics replaced by a placeholder (fewer: a more naturally generic text)


def decision_sentence(text: str) -> str:
    """The sentence of a reasoning that commits to the move: the last one that says what to do next
    ("I should ...", "Let me ..."), else the last sentence; a last fragment of under four words
    without final punctuation (cut off by the token limit) is left out."""
    parts = [p.strip() for p in _SENTENCE_END.split(" ".join(text.replace("\n",
                                                                          " \n ").split(" "))) if p
             and p.strip()]
    if len(parts) > 1 and not parts[-1].endswith((".", "!", "?", ":", '"',
                                                  ")")) and len(parts[-1].split()) < 4:
        parts.pop()  # a few words cut off by the token limit decide nothing
    if not parts:
        return ""
    for p in reversed(parts):
        if _DECISION.search(p):
            return p
    return parts[-1]


def generalise(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> Move | None:
    """A generic move from one reasoning text, or None when nothing generic is left.

    Removes chat markup, JSON and box coordinates; replaces quoted strings and proper names with
    "it" and drops numbers; keeps the decision sentence, cut at a word boundary to ``max_chars``;
    no final period (like the built-in library). Garbage (mostly non-letters, under three words) and
    echoes of the words the model is told ("You have no tool calls left") give None.
    """
    s = _MARKUP.sub(" ", text)
    for f in FORBIDDEN:
        s = s.replace(f, " ")
    s = decision_sentence(s)
    n = 0
    s, k = _JSONISH.subn(" ", s)
    n += k
    s, k = _BOX.subn(f" {PLACEHOLDER} ", s)
    n += k
    s, k = _QUOTED.subn(f" {PLACEHOLDER} ", s)
    n += k
    s, k = _NUMBER.subn(" ", s)
    n += k
    s, k = _names(s)
    n += k
    s = _tidy(s)
    if not s:
        return None
    if len(s) > max_chars:
        cut = s[: max_chars + 1].rsplit(" ", 1)[0]
        s = _tidy(cut)
    words = WORD.findall(s)
    letters = sum(c.isalpha() or c.isspace() for c in s)
    if len(words) < 3 or letters < 0.8 * len(s) or any(f in s for f in FORBIDDEN):
        return None
    if words[0].lower() == "you" or echoes_instructions(s):
        return None  # the prompt's or a tool's words to the model, repeated: not the model's own move
    return Move(s, n)


def _names(s: str) -> tuple[str, int]:
    """Replace runs of capitalised words that are not at a sentence start (and ALL-CAPS words) with
    the placeholder; returns (text, runs replaced)."""
    tokens = s.split(" ")
    out: list[str] = []
    n = 0
    run = False
    start = True  # at a sentence start
    for tok in tokens:
        if not tok:
            continue
        core = tok.strip(".,;:!?()\"'“”")
        is_cap = (bool(core) and core[0].isupper() and core not in _NOT_NAMES
                  and WORD.fullmatch(core) is not None)
        caps = len(core) >= 2 and core.isupper() and core not in _NOT_NAMES and core.isalpha()
        if (is_cap and not start) or caps:
            tail = tok[len(tok.rstrip(".,;:!?)\"'”")):]
            if not run:
                out.append(PLACEHOLDER + tail)
                n += 1
            else:
                out[-1] = PLACEHOLDER + tail
            run = not tail
        else:
            out.append(tok)
            run = False
        start = tok.endswith((".", "!", "?", ":"))
    return " ".join(out), n


def _tidy(s: str) -> str:
    s = re.sub(r"\(\s*\)|\[\s*\]", " ", s)
    s = re.sub(rf"\b({PLACEHOLDER})(\s+(?:and\s+|,\s*)?{PLACEHOLDER}\b)+", PLACEHOLDER, s)
    s = " ".join(s.split())
    s = re.sub(r"\s+([,.;:!?])", r"\1", s)
    s = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", s)
    s = s.strip(" ,;:-–—.!?\"'“”()")
    s = s.rstrip(" ,;:-–—.!?")
    return s[:1].upper() + s[1:] if s else s

