"""What a free-form reasoning says it will do next: search, zoom, search by image, or answer.

Knows: how a small instruct model states its next step in plain English ("I'll search for ...",
"Let me zoom in on ...", "I don't need to search: the answer is ..."), as a few patterns, and the
rule that the last stated plan wins. Used by the loop (free-form: the action follows the reasoning,
the way SSR's action follows its rationale by grammar) and by the eval's reasoning/action agreement.
Also what a person's question asks for: a search (``asks_to_search``), or what no search can help with
(``no_search_for``: a sum and nothing else, a piece of writing, a greeting; no search is offered for it).
Does not know: models, tokens, the chat format. Pure and cheap (a few regular expressions).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection

from edge_agent.tools import specs

# "I'll", "I will", "I should", "I need to", "let me", "I'm going to", "I must", "I can", "we should",
# "let's", "first, ...": a plan in the first person (a few words may sit between it and the verb).
_PLAN = (r"(?:\bi(?:'ll| will| shall| should| need to| must| have to| can| could| would| am going to|'m "
         r"going to|"
         r" want to| ought to)|\blet me|\blet's|\bwe (?:should|need to|will|can)|\bnext,? i|\bfirst,? i)")
_GAP = r"(?:\s+[\w'-]+){0,4}?\s+"
_NEGATION = re.compile(r"\b(?:not|n't|no need|never|without|instead of)\b[\w\s']{0,20}$")
_ANSWER_NOW = re.compile(r"(?:\bthe answer is\b|\bthe final answer\b|\banswer:\s|\bso the answer\b|"
                         r"\bi (?:already )?know (?:the answer|that|this)\b|\bno need to (?:search|look))")


@functools.cache
def _patterns(moves: tuple[specs.ToolSpec, ...]) -> tuple[list[tuple[str, re.Pattern[str]]], ...]:
    """A plan in the first person for each move (its verbs: ``ToolSpec.plan_verbs``), and the fallback: with
    no plan in the first person, a tool named as the next step at the start of a sentence ("Searching for
    ...", "Zoom in on ..."), never a noun ("The search results show ...")."""
    plans = [(s.action, re.compile(_PLAN + _GAP + r"(?:\w+\s+)?" + s.plan_verbs + r"\b")) for s in moves]
    fallback = [(s.action, re.compile(r"(?:^|[.!?:;]\s+)" + s.plan_verbs + r"\b(?!\s+results?\b)"))
                for s in moves if s.is_tool]
    return plans, fallback


def stated_action(reasoning: str, allowed: Collection[str] | None = None) -> str | None:
    """The action ``reasoning`` says it will take next (the last plan it states), or None when it states
    none that is ``allowed``. "I don't need to search, the answer is ..." states an answer."""
    text = " ".join(reasoning.casefold().replace("\u2019", "'").split())
    found: list[tuple[int, str]] = []
    plans, fallback = _patterns(specs.all_specs())
    for action, pattern in plans:
        for m in pattern.finditer(text):
            if _NEGATION.search(text[max(0, m.start() - 30):m.end() - len(m.group(0).split()[-1])]):
                continue  # "I don't need to search" / "I will not search"
            found.append((m.end(), action))
    for m in _ANSWER_NOW.finditer(text):
        found.append((m.end(), "answer"))
    if not found:  # no plan in the first person: a tool named as the next step ("Searching for ...")
        for action, pattern in fallback:
            hit = pattern.search(text)
            if hit and not _NEGATION.search(text[max(0, hit.start() - 30):hit.start()]):
                found.append((hit.end(), action))
    for _end, action in sorted(found, reverse=True):
        if allowed is None or action in allowed:
            return action
    return None


# What a person's question asks the agent to do: search or check ("Are you sure? Please check.", "Search the
# web for ...", "Can you look it up?"), as a request (at a sentence's start, after "please", "can you", ...),
# not a word in a question ("How do I verify my email?", "What is a check digit?").
_ASKER = (r"(?:(?:ok(?:ay)?|so|and|now|then|also|but|just|please|pls|can you|could you|would you|will you|go|"
          r"try to)\s*,?\s+)*")
_REQUEST = re.compile(
    r"(?:^|[.!?;:]\s*)" + _ASKER
    + r"(?:search|google|look(?:\s+(?:it|this|that|them))?\s+up|look\s+(?:it\s+)?online|check|verify|"
      r"double[- ]check|fact[- ]check|confirm|find out)\b"
    r"|\bare you (?:sure|certain)\b|\bis (?:that|this|it) (?:right|correct|true|accurate)\b"
    r"|\b(?:search|look) (?:the web|online|the internet)\b|\bweb search\b")
_NOT_SEARCH = re.compile(r"\b(?:do not|don't|dont|never|without|no need to|not)\s+(?:\w+\s+)?"
                         r"(?:search|look|check|google)|\bno (?:web )?search"
                         r"|\bcheck (?:your|the|my) (?:work|math|maths|arithmetic|calculation|sum|spelling|"
                         r"grammar)")
_IMAGE_WORDS = re.compile(r"\b(?:image|photo|picture|pic|reverse)\b")


def asks_to_search(question: str, allowed: Collection[str]) -> str | None:
    """The search a person's question asks for, when it asks the agent to search or to check (among
    ``allowed``): ``image_search`` for a request about the image (where offered), else ``text_search``; None
    when it asks for none, or asks not to search ("Don't search, just answer.")."""
    text = " ".join(question.casefold().replace("\u2019", "'").split())
    if not _REQUEST.search(text) or _NOT_SEARCH.search(text):
        return None
    if "image_search" in allowed and _IMAGE_WORDS.search(text):
        return "image_search"
    return "text_search" if "text_search" in allowed else None


# a question that is arithmetic and nothing else: "What is 45*67?", "12 x 34 =", "What is 17 times 23?"
_OPERATOR_WORDS = r"(?:times|multiplied by|plus|minus|divided by)"
_ARITHMETIC = re.compile(r"(?:(?:what(?:'s| is)|how much is|calculate|compute|work out|solve)\s+)?"
                         r"(?P<expr>(?:[\d\s.,()*×x+\-−/÷^]|\b" + _OPERATOR_WORDS + r"\b)+?)"
                         r"\s*(?:=\s*)?[?.!]?")
_OPERATION = re.compile(r"\d\s*\)?\s*(?:[*×x+\-−/÷^]|" + _OPERATOR_WORDS + r")\s*\(?\s*\d")


def only_arithmetic(question: str) -> bool:
    """Whether the question is a sum and nothing else ("What is 45*67?", "What is 17 times 23?"): no search
    can work it out (a search engine's results are pages, not a calculator), so the agent answers it from
    what it knows."""
    m = _ARITHMETIC.fullmatch(" ".join(question.casefold().replace("\u2019", "'").split()))
    return (m is not None and _OPERATION.search(m["expr"]) is not None
            and not re.search(r"\d{4}-\d{1,2}-\d{1,2}", m["expr"]))  # a date is no sum


# A request to write something (a poem, code, a translation, a summary) at the message's start, after a polite
# opening ("Please", "Can you", "I'd like you to", "Help me"): a search brings nothing to writing, and the
# answer check's probe, which measures how sure the model is of a fact, reads a poem's many possible
# wordings as doubt ("Write a haiku about the sea." searched and became an essay on sea haiku).
_WRITER = (r"(?:(?:ok(?:ay)?|so|now|then|also|just|please|pls|kindly|can you|could you|would you|will you|"
           r"i'd like you to|i would like you to|i want you to|i need you to|help me)\s*,?\s+)*")
_WRITING = re.compile(_WRITER + r"(?:write|compose|draft|translate|rewrite|rephrase|paraphrase|summari[sz]e|"
                      r"proofread|refactor|(?:tell|give) me a (?:joke|story|poem|riddle|limerick|haiku)|"
                      r"make up a)\b")
# a message that only greets or thanks ("Hello!", "Thanks a lot.", "Good morning, how are you?")
_GREETING_WORDS = (r"(?:hi|hello|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening|night)|thanks|"
                   r"thank you|thx|cheers|bye|goodbye|see you|how are you(?: doing)?|how's it going|"
                   r"what's up)")
_GREETING = re.compile(_GREETING_WORDS + r"(?:[\s,!.?:;)(-]+(?:" + _GREETING_WORDS
                       + r"|there|a lot|so much|very much|again|all|everyone|friend))*[\s,!.?:;)(-]*")


def no_search_for(question: str) -> str | None:
    """What makes a search useless for this question: ``"sum"`` (arithmetic and nothing else), ``"writing"``
    (a request to write, translate, summarise ...), ``"greeting"`` (a greeting or thanks and nothing else);
    None for a question a search may help with, and for any that asks to search ("Translate this; look it
    up first.")."""
    text = " ".join(question.casefold().replace("\u2019", "'").split())
    if only_arithmetic(question):
        return "sum"
    if asks_to_search(question, {"text_search"}) is not None:
        return None
    if _GREETING.fullmatch(text):
        return "greeting"
    if _WRITING.match(text):
        return "writing"
    return None
