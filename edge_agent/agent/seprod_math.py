"""SeProD's pure parts: what the prophet is asked (queries, the cleaned zoom label, the verdict), the
acceptance maths (s_j = p_s^a_j p_p^(1-a_j), a_j from the token's rank in the search model's logits, the
accepted prefix) and the values a round produces (Draft, Verification, the per-question statistics).

Knows numbers and token ids only. Does not know models, sessions, threads or prompts: the drafter in
``edge_agent.agent.seprod`` feeds it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

GROUNDING = "grounding"
ANSWERING = "answering"
DRAFT_MODES = (GROUNDING, ANSWERING)

# Sharpness of the rank adjustment (see combined_scores). 1.0: a_j moves linearly in log-rank.
DEFAULT_GAMMA = 1.0

# A draft is cut before the first token whose text would contain one of these: they belong to the
# agent's turn structure, and a prophet writing them means it has left the content it was asked for.
DEFAULT_CUT = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "</answer>", "<answer>", "</think>",
               "<think>", "<tool_call>", "</tool_call>", "<tool_response>")

# An answering draft becomes answer text, which the agent's answer grammar writes without "</", "<|" or "<"
# and a letter (not beginning with "{") then ``</answer>``: a draft is cut before its first "<" (the
# grammar's states after one are not tracked here; a shorter draft, never a token the agent could not have
# generated; a draft beginning with "{" is no draft: ``seprod_prophet``).
ANSWER_CUT = ("<",)


# --------------------------------------------------------------------------------------------------
# Acceptance maths (pure)
# --------------------------------------------------------------------------------------------------


def normalised_rank(ranks: np.ndarray | Sequence[int], n_vocab: int) -> np.ndarray:
    """u_j in [0, 1]: 1 for the search model's argmax (rank 0), 0 for its last-ranked token.

    u_j = 1 - log(1 + rank_j) / log(V). Log scale because ranks of plausible tokens are heavy-tailed:
    on a 151k vocabulary a linear 1 - rank/(V-1) gives u > 0.999 to every token in the top 150, so it
    could not tell the model's second choice from its hundredth. In log scale rank 1 -> 0.94,
    rank 10 -> 0.80, rank 100 -> 0.61, rank 1000 -> 0.42 (V = 151,936).
    """
    r = np.asarray(ranks, dtype=np.float64)
    if n_vocab < 2:
        raise ValueError("n_vocab must be at least 2")
    if r.size and (r.min() < 0 or r.max() > n_vocab - 1):
        raise ValueError(f"ranks must lie in [0, {n_vocab - 1}]")
    return 1.0 - np.log1p(r) / math.log(n_vocab)


def search_weight(ranks: np.ndarray | Sequence[int], n_vocab: int, a0: float,
                  gamma: float = DEFAULT_GAMMA) -> np.ndarray:
    """a_j = a0 + (1 - a0) * u_j ** gamma, with u_j = :func:`normalised_rank` (so a0 <= a_j <= 1).

    The search model's argmax gets a_j = 1 (s_j = p_s: the agent would pick it anyway, the prophet's
    opinion adds nothing); a token the agent ranks last gets a_j = a0 (the base weight). gamma > 1
    keeps a_j near a0 except for the very top ranks; gamma < 1 trusts the agent earlier.
    """
    if not 0.0 <= a0 <= 1.0:
        raise ValueError("a0 must be in [0, 1]")
    if gamma <= 0:
        raise ValueError("gamma must be > 0")
    return a0 + (1.0 - a0) * normalised_rank(ranks, n_vocab) ** gamma


def combined_scores(
    logp_search: np.ndarray | Sequence[float],
    logp_prophet: np.ndarray | Sequence[float],
    ranks: np.ndarray | Sequence[int],
    n_vocab: int,
    a0: float,
    gamma: float = DEFAULT_GAMMA,
) -> np.ndarray:
    """s_j = p_s(o_j) ** a_j * p_p(o_j) ** (1 - a_j), a weighted geometric mean in [0, 1].

    ``logp_search[j]`` = log p_s(o_j | agent context, o_<j) (teacher forcing on the agent),
    ``logp_prophet[j]`` = log p_p(o_j | prophet's image + query, o_<j) (kept while drafting),
    ``ranks[j]`` = tokens the agent ranks strictly above o_j. Computed in log space (no underflow
    for the product; exp of a very negative sum is 0.0, which tau = 0 still accepts). Shapes (L,).
    """
    ls = np.asarray(logp_search, dtype=np.float64)
    lp = np.asarray(logp_prophet, dtype=np.float64)
    if ls.shape != lp.shape or ls.shape != np.shape(ranks):
        raise ValueError(f"shapes differ: {ls.shape} {lp.shape} {np.shape(ranks)}")
    a = search_weight(ranks, n_vocab, a0, gamma)
    return np.exp(a * ls + (1.0 - a) * lp)


def accepted_length(scores: np.ndarray | Sequence[float], tau: float) -> int:
    """Length of the longest prefix with every s_j >= tau (accept up to the first s_j < tau).

    tau <= 0 accepts every token; a tau above every score accepts none.
    """
    s = np.asarray(scores, dtype=np.float64)
    below = np.flatnonzero(s < tau)
    return int(below[0]) if below.size else int(s.size)


# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """What the prophet proposed: up to L_d greedy tokens and its own log-probs log p_p (shape (L,))."""

    mode: str
    query: str
    tokens: tuple[int, ...]
    logprobs: np.ndarray  # (L,) float64, log p_p of each drafted token
    text: str
    seconds: float  # prophet time to build the prompt and draft (in the worker thread)
    waited: float = 0.0  # time the caller blocked for it (0 when it was ready)
    draft_len: int = 0  # the L_d it was asked for (the adaptive rule may shorten it)


@dataclass
class Verification:
    """The agent's verdict on a draft: ``accepted`` leading tokens are now in the agent's KV cache.

    The loop reads ``accepted_text``, ``lead``, ``accepted``, ``verdict`` and ``steer``. A round that
    used no draft (skipped, or the prophet failed) is a Verification with ``accepted == 0`` and
    ``skipped`` saying why.
    """

    draft: Draft
    accepted: int
    scores: np.ndarray  # (L,) s_j
    weights: np.ndarray  # (L,) a_j
    logp_search: np.ndarray  # (L,) log p_s
    ranks: np.ndarray  # (L,) agent ranks
    accepted_text: str
    seconds: float  # score + adopt
    adopted: str = "none"  # how the accepted tokens entered the cache: "adopted" | "evaluated" | "none"
    lead: tuple[int, ...] = ()  # the agent's own whitespace token before the draft (see agent_lead)
    verdict: str = ""  # grounding: "yes" | "no" | "" (unclear, or not a grounding round)
    verdict_accepted: bool = False  # the verdict word is inside the accepted prefix
    steer: str = ""  # text the loop appends after accepted_text (an accepted "no": look elsewhere)
    skipped: str = ""  # "" (a draft was verified) | one of SKIP_REASONS

    @property
    def accepted_tokens(self) -> tuple[int, ...]:
        return self.draft.tokens[: self.accepted]

    @classmethod
    def empty(cls, mode: str, query: str, *, skipped: str = "", waited: float = 0.0) -> Verification:
        """Nothing drafted or nothing verified: the agent's session was not touched."""
        z = np.zeros(0)
        d = Draft(mode, query, (), z, "", 0.0, waited)
        return cls(d, 0, z, z, z, np.zeros(0, dtype=np.int64), "", 0.0, skipped=skipped)


SKIP_REASONS = ("not_ready", "low_acceptance", "failed", "answered", "diverged")


@dataclass
class SeProDStats:
    """Running totals over an episode (for ``FinalAnswer.totals`` and the benchmark).

    A *round* is a hook reached (a point where a draft could be used): ``drafts`` were verified,
    ``skipped[reason]`` were not. ``waited`` counts used drafts the agent had to wait for.
    """

    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    wait_seconds: float = 0.0  # all waiting, including waits that ended in a skip
    verify_seconds: float = 0.0
    waited: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    by_mode: dict[str, list[int]] = field(default_factory=dict)  # mode -> [drafted, accepted]

    def add(self, v: Verification) -> None:
        self.drafts += 1
        self.drafted_tokens += len(v.draft.tokens)
        self.accepted_tokens += v.accepted
        self.draft_seconds += v.draft.seconds
        self.wait_seconds += v.draft.waited
        self.waited += v.draft.waited > 0
        self.verify_seconds += v.seconds
        m = self.by_mode.setdefault(v.draft.mode, [0, 0])
        m[0] += len(v.draft.tokens)
        m[1] += v.accepted

    def skip(self, reason: str, waited: float) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.wait_seconds += waited

    @property
    def rounds(self) -> int:
        return self.drafts + sum(self.skipped.values())

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def totals(self) -> dict[str, float]:
        out = {
            "seprod_rounds": float(self.rounds),
            "seprod_drafts": float(self.drafts),  # drafts used (verified)
            "seprod_drafts_skipped": float(sum(self.skipped.values())),
            "seprod_drafts_waited": float(self.waited),
            "seprod_drafted_tokens": float(self.drafted_tokens),
            "seprod_accepted_tokens": float(self.accepted_tokens),
            "seprod_acceptance_rate": self.acceptance_rate,
            "seprod_draft_seconds": self.draft_seconds,
            "seprod_wait_seconds": self.wait_seconds,
            "seprod_verify_seconds": self.verify_seconds,
        }
        for reason in SKIP_REASONS:
            out[f"seprod_skipped_{reason}"] = float(self.skipped.get(reason, 0))
        for mode, (drafted, accepted) in self.by_mode.items():
            out[f"seprod_drafted_{mode}"] = float(drafted)
            out[f"seprod_accepted_{mode}"] = float(accepted)
            out[f"seprod_acceptance_{mode}"] = accepted / drafted if drafted else 0.0
        return out


# --------------------------------------------------------------------------------------------------
# Prophet prompts (what the prophet sees: the image and this query, nothing else)
# --------------------------------------------------------------------------------------------------

LABEL_MAX_CHARS = 80
DEFAULT_TARGET = "the object in question"
_MARKUP = re.compile(r"<\|?/?[A-Za-z_]*\|?>|[<>{}\[\]`\\|]")

# Added after an accepted "no" verdict (the paper: "false prompts the search model to re-localise").
STEER_ELSEWHERE = "\nIt is not in this crop, so I should look elsewhere in the image.\n"
_YES = frozenset({"yes", "true", "yeah", "yep"})
_NO = frozenset({"no", "false", "nope"})
_FIRST_WORD = re.compile(r"[\W_]*([A-Za-z]+)")


def clean_label(label: object) -> str:
    """A zoom label (untrusted model output) fit to go into the prophet's query, or "" to drop it.

    Printable characters only, markup and chat-format tags removed, whitespace collapsed, at most
    ``LABEL_MAX_CHARS`` (cut at a word boundary). Garbage (fewer than 2 letters, or letters and digits
    less than half of the text) gives "".
    """
    if not isinstance(label, str):
        return ""
    text = "".join(ch if ch.isprintable() else " " for ch in label)
    text = " ".join(_MARKUP.sub(" ", text).split())
    if len(text) > LABEL_MAX_CHARS:
        cut = text[: LABEL_MAX_CHARS + 1].rsplit(" ", 1)[0]
        text = (cut if len(cut) >= LABEL_MAX_CHARS // 2 else text[:LABEL_MAX_CHARS]).rstrip(" ,;:-")
    letters = sum(ch.isalpha() for ch in text)
    alnum = sum(ch.isalnum() for ch in text)
    if letters < 2 or alnum < len(text.replace(" ", "")) / 2:
        return ""
    return text


def grounding_query(target: str) -> str:
    """Q^g: is the target in the crop? A yes/no verdict first, then details. ``target`` (the zoom label,
    or the question when the agent wrote none) goes through :func:`clean_label`."""
    t = clean_label(target) or DEFAULT_TARGET
    return (
        f"Does this image contain {t}? Answer yes or no first. "
        f"If yes, then describe the details of {t} that you can see."
    )


def parse_verdict(text: str) -> tuple[str, int]:
    """The verdict a grounding draft opens with, and where its word ends in ``text``.

    ("yes" | "no", end) when the first word is yes/true/yeah/yep or no/false/nope (any case, after
    punctuation or markdown); ("", 0) otherwise (unclear: the draft did not answer the question).
    """
    m = _FIRST_WORD.match(text)
    if not m:
        return "", 0
    word = m.group(1).lower()
    if m.end() < len(text) and text[m.end()].isalnum():  # "no" of "no2": not a word
        return "", 0
    if word in _YES:
        return "yes", m.end()
    if word in _NO:
        return "no", m.end()
    return "", 0


def answering_query(question: str) -> str:
    """The answering mode's query is the user's question, as asked."""
    return question.strip()


def draft_image_key(image: bytes | None) -> str:
    """A draft's image identity: a 128-bit hash of the PNG bytes ("" for no image)."""
    return hashlib.blake2b(image, digest_size=16).hexdigest() if image is not None else ""


# The ``seprod_tau`` setting's default (edge_agent.core.config; a test keeps the two equal): at 0.05 the
# benchmark's SmolLM2 pair accepted half of its drafts, at 0.1 a fifth.
DEFAULT_TAU = 0.05
