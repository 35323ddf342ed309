"""The SSR rationale library and the selection maths.

Knows: what a rationale is (an id, a short text, the action type it implies), how to load and
validate a library file (the built-in ``edge_agent/data/rationales.json`` or a user's own), and how
to turn candidate scores into a choice: p = softmax(mean log-prob / tau), argmax or one seeded
categorical draw. Does not know: models, tokens, the chat format (see prompts.py), the loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core.errors import ConfigError
from edge_agent.tools import specs


def library_actions() -> tuple[str, ...]:
    """The action types a rationale may imply (each is a move of ``edge_agent.tools.specs``: a tool, or the
    answer), in the order a library groups them (``ToolSpec.library_rank``)."""
    return tuple(s.action for s in sorted(specs.all_specs(), key=lambda s: (s.library_rank, s.action)))


# A rationale that implies no action (the library-size ablation's one-rationale library): the model then
# chooses the action as in free-form, under the grammar of every allowed action.
ANY_ACTION = "any"
# Strings that would break the chat format if pasted inside <think>...</think>.
FORBIDDEN = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>",
             "<tool_response>", "</tool_response>", "<|")
MAX_RATIONALES = 15  # the runtime scores them in seqs 1..K of one context (n_seq_max >= K + 1)
MAX_CHARS = 400
# the kinds of message a rationale can be for ("for" in a library): intent.no_search_for's
MESSAGE_KINDS = ("writing", "greeting")


class RationaleLibraryError(ConfigError):
    title = "Bad rationale library"


@dataclass(frozen=True)
class Rationale:
    """One pre-written reasoning step; pasting it commits the turn to ``action``."""

    id: str
    text: str
    action: str  # one of library_actions()
    needs_image: bool = False  # e.g. "answer from the image": offered only when there is an image
    # e.g. "answer from the evidence": offered only once a tool's result (search results, a crop) is in the
    # context
    needs_evidence: bool = False
    # e.g. "I know this, so I will state the answer": offered until a tool's result is in the context; after
    # one only where no other rationale of its action is offered (then "answer from the evidence" answers)
    before_evidence: bool = False
    # e.g. "I can write this myself, so I will write it in full": offered only for a message of this kind
    # (intent.no_search_for: "writing", "greeting"), where it takes the place of its action's rationales for
    # before the evidence ("I know this, so I will state the answer in a full sentence", after which the 1.5B
    # answered "Write a Python function ..." with "Yes, I can write a Python function ..." and "thanks!" by
    # restating the chat's last answer); "" for every question
    for_kind: str = ""


@dataclass(frozen=True)
class Library:
    rationales: tuple[Rationale, ...]
    source: str  # "built-in" or the file's path

    def __len__(self) -> int:
        return len(self.rationales)

    def __iter__(self):
        return iter(self.rationales)

    def for_actions(self, allowed: set[str] | frozenset[str], *, has_image: bool = True,
                    has_evidence: bool = True, kind: str = "") -> list[int]:
        """Indices of the rationales whose action is allowed (keeps library order).

        Without an image, rationales that need one are left out: a text-only question must not be
        answered "from the image"; before any tool result, none is answered "from the evidence"; after
        one, a rationale for before the evidence ("I know this") is left out where another of its action is
        offered: with search results in the context (after a follow-up's "please check", say) the 1.5B
        chose "I know this" over "answer from the evidence" and copied its earlier, wrong answer. A rationale
        for a kind of message (``for_kind``) is offered only for that kind (``kind``: "writing", "greeting"),
        and there a rationale for before the evidence of its action is not.
        """
        offered = [i for i, r in enumerate(self.rationales)
                   if (r.action in allowed or r.action == ANY_ACTION) and (has_image or not r.needs_image)
                   and (has_evidence or not r.needs_evidence) and r.for_kind in ("", kind)]
        if kind:  # the actions with a rationale for this kind: their "I know this" gives way
            own = {self.rationales[i].action for i in offered if self.rationales[i].for_kind}
            offered = [i for i in offered
                       if not self.rationales[i].before_evidence or self.rationales[i].action not in own]
        if not has_evidence:
            return offered
        after = {self.rationales[i].action for i in offered if not self.rationales[i].before_evidence}
        return [i for i in offered if not self.rationales[i].before_evidence
                or self.rationales[i].action not in after]


def builtin_library(name: str = "") -> Library:
    """The built-in library, or (``name``) one of the library-size ablation's (``k1``, ``k2``:
    ``edge_agent/data/ablations/``)."""
    parts = ("data", "ablations", f"{name}.json") if name else ("data", "rationales.json")
    text = resources.files("edge_agent").joinpath(*parts).read_text(encoding="utf-8")
    return parse_library(json.loads(text), source=f"built-in {name}" if name else "built-in")


def load_library(path: str | Path | None = None) -> Library:
    """The user's library at ``path`` (validated), or the built-in one when ``path`` is empty."""
    if not path:
        return builtin_library()
    p = Path(path).expanduser()
    hint = "Fix it, or clear the `rationales` setting to use the built-in library."
    if not p.is_file():
        raise RationaleLibraryError(f"Rationale library not found: {p}. {hint}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RationaleLibraryError(f"{p} is not valid JSON ({e}). {hint}") from e
    return parse_library(data, source=str(p))


def parse_library(data: Any, *, source: str) -> Library:
    """Validate a decoded library: ``{"rationales": [{"id", "action", "text"}, ...]}`` or a bare list."""
    where = "the built-in library" if source == "built-in" else source
    shape = ('Expected {"rationales": [{"id": "zoom", "action": "zoom", "text": "I should zoom in ..."}, '
             '...]} '
             f"with action one of {', '.join(library_actions())}.")
    items = data.get("rationales") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise RationaleLibraryError(f"{where} holds no rationales. {shape}")
    if len(items) > MAX_RATIONALES:
        raise RationaleLibraryError(f"{where} has {len(items)} rationales; at most {MAX_RATIONALES} are "
                                    f"supported.")
    out: list[Rationale] = []
    seen: set[str] = set()
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise RationaleLibraryError(f"Rationale {n} in {where} is not an object. {shape}")
        rid, action, text = item.get("id", f"r{n}"), item.get("action"), item.get("text")
        if not isinstance(rid, str) or not rid.strip():
            raise RationaleLibraryError(f"Rationale {n} in {where}: id must be a non-empty string.")
        if rid in seen:
            raise RationaleLibraryError(f"Rationale {n} in {where}: id {rid!r} is used twice.")
        if action not in (*library_actions(), ANY_ACTION):
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where}: action must be one of {', '.join(library_actions())} (or "
                f"{ANY_ACTION!r}: the model chooses), not {action!r}.")
        if not isinstance(text, str) or not text.strip():
            raise RationaleLibraryError(f"Rationale {rid!r} in {where}: text must be a non-empty string.")
        text = " ".join(text.split())  # one line: it sits between "<think>\n" and "\n</think>"
        if len(text) > MAX_CHARS:
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where} is {len(text)} characters; keep it under {MAX_CHARS} "
                "(every scored token costs time).")
        bad = [f for f in FORBIDDEN if f in text]
        if bad:
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where} contains {bad[0]!r}, which would break the chat format.")
        needs_image = item.get("needs_image", action != ANY_ACTION and specs.by_action(action).needs_image)
        needs_evidence = item.get("needs_evidence", False)
        before_evidence = item.get("before_evidence", False)
        for_kind = item.get("for", "")
        if not all(isinstance(v, bool) for v in (needs_image, needs_evidence, before_evidence)):
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where}: needs_image, needs_evidence and before_evidence must be true "
                "or false.")
        if for_kind not in ("", *MESSAGE_KINDS):
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where}: \"for\" must be one of {', '.join(map(repr, MESSAGE_KINDS))} "
                "(a kind of message it is offered for), or left out (every question).")
        if needs_evidence and before_evidence:
            raise RationaleLibraryError(
                f"Rationale {rid!r} in {where}: needs_evidence and before_evidence exclude each other (it "
                "would never be offered with another of its action). Keep one.")
        seen.add(rid)
        out.append(Rationale(rid, text, action, needs_image, needs_evidence, before_evidence, for_kind))
    if not any(r.action in ("answer", ANY_ACTION) for r in out):
        raise RationaleLibraryError(
            f"{where} has no rationale with action \"answer\": the agent could never answer. Add one.")
    return Library(tuple(out), source)


def index_label(k: int) -> str:
    """The index-only ablation's candidate for the k-th rationale (0-based): "[1]", "[2]", ..."""
    return f"[{k + 1}]"


def softmax(scores: np.ndarray | list[float], tau: float = 1.0) -> np.ndarray:
    """p_k = exp(s_k / tau) / sum_j exp(s_j / tau), computed stably in float64."""
    if tau <= 0:
        raise ValueError("tau must be > 0")
    s = np.asarray(scores, dtype=np.float64) / tau
    if s.size == 0:
        return s
    s = s - np.max(s)
    e = np.exp(s)
    return e / e.sum()


def select(scores: np.ndarray | list[float], *, tau: float = 1.0, sample: bool = False,
           rng: np.random.Generator | None = None) -> tuple[int, np.ndarray]:
    """(chosen index, probabilities). Argmax (first on ties) by default, or one categorical draw."""
    p = softmax(scores, tau)
    if p.size == 0:
        raise ValueError("no candidates to select from")
    if not sample:
        return int(np.argmax(p)), p
    rng = rng if rng is not None else np.random.default_rng(0)
    # inverse-CDF draw: one uniform number, reproducible for a seed
    u = rng.random()
    k = int(np.searchsorted(np.cumsum(p), u, side="right"))
    return min(k, p.size - 1), p
