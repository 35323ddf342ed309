"""SSR's answer check: how sure the model is of an answer it would give from what it knows.

Knows: the score of the answer's first tokens (decoded greedily by the loop before the answer stays in the
context). Not the mean log-prob of every token: a full-sentence answer starts by restating the question
("Israel's civil aircraft registration prefix is ..."), tokens the model is sure of whatever it knows, so
a mean over the first six said little about the fact that follows (on the dev split the wrong "IL", ".ac"
passed). The score is the mean log-prob of the tokens the answer *adds*: a token whose letters and digits
are a word of the question (read across tokens: " Kos", "ci", "usz", "ko" are "Kosciuszko"; with an ending
added or taken off: "stands" for the question's "stand"), or one of a few function words, or that has no
letter or digit at all, does not count. With no such token left, every token counts; and the words that
say why an unsure answer is taken back. Does not know: the session, the loop, how the threshold is chosen.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence

from edge_agent.agent.events import AnswerChecked
from edge_agent.tools import specs

# words that phrase an answer rather than state it ("X is the Y of Z", "X uses the Y")
_PHRASING = frozenset(
    "a an the is are was were of in on at to by for its it s as and or be has have equals equal".split())
# and words that name nothing, which two answers may share whatever they say ("There are four ..." and "There
# are three ...": :func:`agree` reads past them)
_FUNCTION = frozenset(
    "there this that these those which who whom whose what when where why how he she they we i you his her "
    "their our your him them not no with from than then also".split())
_WORD = re.compile(r"[^\W_]+")
_ENDINGS = ("s", "es", "d", "ed", "ing")  # the endings an answer restating a question's word may add
# an arithmetic operator between numbers, and the words that say it ("What is 45*67?": "45 multiplied by 67")
_OPERATORS = ((re.compile(r"\d\s*[*×xX]\s*\d"), "times multiplied product"),
              (re.compile(r"\d\s*\+\s*\d"), "plus sum added"),
              (re.compile(r"\d\s*[-−]\s*\d"), "minus difference subtracted"),
              (re.compile(r"\d\s*[/÷]\s*\d"), "divided quotient over"))


# why the answer goes before a first text search that SSR chose (RationaleScored.why)
ANSWER_FIRST = "its answer is checked before a first search"
# why the answer rationale goes first unscored (RationaleScored.why, scored False)
ANSWER_UNSCORED = ("its answer is checked before a first search, whatever the scores, and the search is the "
                   "only other move: nothing to score")
# why the one rationale for the moves allowed is not scored (RationaleScored.why)
ONLY_RATIONALE = "the only rationale for the moves allowed: nothing to score"
# why the answer goes unscored for a question that is only arithmetic (RationaleScored.why)
A_SUM = "a search cannot work out a sum: the answer is the only move"
# why the answer goes unscored for a question no search can help with, by intent.no_search_for's kind
NO_SEARCH = {"sum": A_SUM,
             "writing": "a search cannot do the writing asked for: the answer is the only move",
             "greeting": "a greeting needs no search: the answer is the only move"}
# why a search goes first unscored: the person asked for it (RationaleScored.why)
ASKED_SEARCH = "the question asks for a search"
# why a rationale chosen again after an unscored choice is not scored either (RationaleScored.why empty)
ONLY_MOVE_LEFT = "the only move left"


def inflections(word: str) -> set[str]:
    """``word`` and the forms an answer restating it may write: its stem with an ending added or taken off
    ("stand", "stands"; "compose", "composed", "composing"; "composes", "composed"), for stems of three
    letters or more."""
    stems = {word}
    for end in ("s", "es", "ed", "ing"):
        if word.endswith(end) and len(word) - len(end) >= 3:
            stem = word[:-len(end)]
            stems |= {stem, stem + "e"} if end in ("ed", "ing") else {stem}
    forms = set(stems)
    for stem in stems:
        if len(stem) >= 3:
            forms |= {stem + end for end in _ENDINGS}
        if stem.endswith("e") and len(stem) >= 4:
            forms.add(stem[:-1] + "ing")
    return forms


@functools.lru_cache(maxsize=64)  # read after each token of a probe (probe_done): one question, many reads
def question_words(question: str) -> frozenset[str]:
    """The question's words, case-folded (letters and digits), with their inflections (:func:`inflections`:
    "What does DNA stand for?" answered "... stands for DNA" adds nothing by "stands"), the phrasing words,
    and the words of an arithmetic operator the question writes as a symbol (``*``: "times", "multiplied",
    "product")."""
    said = {w for pattern, words in _OPERATORS if pattern.search(question) for w in words.split()}
    asked = {form for w in _WORD.findall(question) for form in inflections(w.casefold())}
    return frozenset(asked) | _PHRASING | said


def adding(pieces: Sequence[str], question: str) -> list[bool | None]:
    """Which tokens add to ``question``, word by word: a token adds when a word it is part of is not one of
    the question's words (nor a phrasing word). Words are read across tokens: " Kos", "ci", "usz", "ko" are
    the question's "Kosciuszko", and add nothing (token by token each looked new). The last word may go on
    in the next token: while it is a question word or the start of one it is undecided (None: "Peru" may
    become "Peruvian", " Kos" "Kosciuszko"); a token of such a word and of no adding one is None."""
    known = question_words(question)
    text = "".join(pieces)
    words = [(m.start(), m.end(), m.group().casefold()) for m in _WORD.finditer(text)]
    out: list[bool | None] = []
    pos = 0
    for piece in pieces:
        start, end = pos, pos + len(piece)
        pos = end
        verdicts = [(w not in known) if e < len(text) or not any(k.startswith(w) for k in known) else None
                    for s, e, w in words if s < end and e > start]
        out.append(True if True in verdicts else None if None in verdicts else False)
    return out


def added_words(text: str, question: str, *, whole: bool = True) -> list[str]:
    """The words of ``text`` that add to ``question`` (case-folded, in order); ``whole`` False: the text was
    cut (a decode stopped at its length) and its last word may be the start of a longer one, left out."""
    words = [m.group().casefold() for m in _WORD.finditer(text)]
    if not whole and words and text.rstrip() == text:
        words = words[:-1]
    known = question_words(question) | _FUNCTION
    return [w for w in words if w not in known]


def agree(answer: Sequence[str], other: Sequence[str]) -> bool:
    """Whether two answers' added words (:func:`added_words`) name the same thing: the first word either
    adds is a word the other adds ("Newton formulated ..." and "Isaac Newton formulated ...": "newton";
    "Ludwig van Beethoven" and "Beethoven composed ..."); not "Mercury" and "Mars", nor two answers that
    share only a later word."""
    return bool(answer) and bool(other) and (answer[0] in other or other[0] in answer)


def answer_score(pieces: Sequence[str], logprobs: Sequence[float], question: str) -> float:
    """The mean log-prob of the tokens that add to ``question`` (all tokens when none does; 0 for none). The
    probe is read whole: a last word still undecided (:func:`adding`) restates the question, and adds
    nothing."""
    added = [lp for a, lp in zip(adding(pieces, question), logprobs, strict=True) if a]
    kept = added or list(logprobs)
    return sum(kept) / len(kept) if kept else 0.0


def out_of_reach(pieces: Sequence[str], logprobs: Sequence[float], question: str, threshold: float,
                 left: int) -> bool:
    """Whether :func:`answer_score` of these tokens and any ``left`` more must stay below ``threshold``: the
    tokens that add to the question so far have the mean log-prob ``s / n``, and the best that ``left`` more
    tokens can do is add ``left`` tokens of log-prob 0, and the ``u`` tokens of an undecided last word add
    with log-prob 0 at best (``s / (n + u + left)``; fewer, or tokens that add nothing, leave it lower).
    With no token adding yet, a sure one may still come. The check stops there: its verdict is the one the
    whole probe would give (the margin covers log-probs a rounding above 0)."""
    marks = adding(pieces, question)
    added = [lp for a, lp in zip(marks, logprobs, strict=True) if a]
    undecided = marks.count(None)
    return bool(added) and sum(added) / (len(added) + undecided + left) < threshold - 1e-6


def probe_done(pieces: Sequence[str], logprobs: Sequence[float], question: str, threshold: float, wanted: int,
               *, early: bool = True) -> bool:
    """Whether the answer check stops reading after these tokens: once it has ``wanted`` of them and one adds
    to the question (a full sentence restates a long question before its fact; the caller caps how far it
    reads on); before that only when ``early`` and the threshold is out of reach (:func:`out_of_reach`)."""
    if len(pieces) >= wanted:
        return any(adding(pieces, question))
    return early and out_of_reach(pieces, logprobs, question, threshold, wanted - len(pieces))


def said(check: AnswerChecked) -> str:
    """The probe's text as a person reads it: without the answer grammar's closing ``</`` it stopped at."""
    text = "".join(check.pieces).strip()
    return text[:-2].rstrip() if text.endswith("</") else text


def agreed_note(check: AnswerChecked) -> str:
    """What the second look added to the score (``AnswerChecked.agreed``), as words to append: "" without
    one; else the other answers that named the same thing, their probability added to the first word's."""
    if not check.agreed:
        return ""
    shown = ", ".join(repr(a if len(a) <= 30 else a[:27] + "...") for a in check.agreed)
    return f"; its first word counts with the other wordings that name the same: {shown}"


def then_what(others: Collection[str]) -> str:
    """What the agent does instead of an answer it took back, by the moves left (``others``: actions, the
    answer not among them): "it searches first", or, with no search left (offline, nothing cached: an
    image question), "it zooms in first"."""
    searches = {a for a in others if specs.by_action(a).is_search}
    if searches and searches == set(others):
        return "it searches first"
    if set(others) == {"zoom"}:
        return "it zooms in first"
    return "it zooms in or searches first" if searches and "zoom" in others else "it takes another move first"


def unsure_why(check: AnswerChecked, then: str = "it searches first") -> str:
    """Why an answer the check is not sure of is taken back (``MoveWithdrawn.reason``); ``then``: what comes
    instead (:func:`then_what`)."""
    if check.early:
        return (f"the model is not sure of its answer ({said(check)!r}...: what it adds to the question has "
                f"mean log-prob {check.score:.2f}, and the next tokens could not bring it to answer_check "
                f"{check.threshold:g}): {then}")
    return (f"the model is not sure of its answer ({said(check)!r}...: mean log-prob {check.score:.2f} of "
            f"what it adds to the question, below answer_check {check.threshold:g}{agreed_note(check)}): "
            f"{then}")
