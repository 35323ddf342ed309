"""SeProD (self-prophetic decoding): a base "prophet" model drafts tokens, the agent verifies them.

What this module knows:
- the acceptance rule (pure numpy, see :func:`combined_scores` for the formula and why);
- what the prophet is shown: ONLY the current image (the latest crop, or the original; none for
  text-only models) and a mode query, in the shared ChatML format. The query is the user's question
  (answering) or a yes/no question about a target (grounding). The target is the zoom ``label`` the
  agent wrote (as in the paper, the search model decides what to look for): that label is the ONLY
  agent text the prophet ever sees, and it is treated as untrusted model output (:func:`clean_label`:
  printable, at most ``LABEL_MAX_CHARS``, dropped when empty or garbage; tokenized with special
  tokens not parsed). Never the agent's reasoning or history;
- how a draft is verified: one batched teacher-forced ``score`` call on the agent's session
  (log p_s and ranks of every draft token in one decode), then the accepted prefix is put into the
  agent's KV cache exactly as if the agent had generated it (adopted from the scoring pass when the
  runtime can, else evaluated); the agent then continues from its own distribution. "Exactly": same
  tokens, positions and cells; the values equal sequential decoding on F32 weights, and on quantized
  weights up to the batch-shape rounding llama.cpp has anyway (near-ties can flip later greedy picks);
- that the agent writes its own format whitespace before a draft (``Drafter(agent_lead=True)``);
- when a draft is worth it (:class:`Costs`, :class:`Adaptive`): a draft that is ready is used; one
  that is not is waited for only while the expected saving (recent acceptance x draft length x the
  agent's decode time per token, less the verification) exceeds the expected wait, else the agent
  goes on without it (``DraftSkipped``) and the prophet's work on it is cancelled. A prepared draft
  is fitted to the measured time the agent works before needing it (shorter L_d, or no draft at all
  when nothing useful would be ready: the prophet then takes no CPU from the agent). Per chat and
  mode, acceptance decides whether a mode drafts at all (off below break-even, probed again now and
  then) and how long its drafts are (L_d shortened to about twice the recent accepted length);
- the grounding verdict: the prophet answers yes/no first (:func:`parse_verdict`); an accepted "no"
  adds :data:`STEER_ELSEWHERE` after the accepted text, so the agent's next step looks elsewhere;
- the events it yields (DraftProposed, DraftVerified, DraftSkipped, AnswerToken(from_prophet=True),
  and a non-fatal AgentError when the prophet cannot draft).

What it does not know: llama.cpp (it talks to ``runtime.types.ModelLike`` / ``SessionLike``), where in
the agent's turn a draft goes (the loop decides: a grounding draft opens the think block after a
zoom, an answering draft is the start of the answer), grammars, the UI, thread counts (the engine
picks them; :func:`prophet_threads` is its rule). The prophet model is used from one worker thread
only (so drafts can be prepared while the agent works; see ``Drafter.start``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np

from edge_agent.agent.events import AgentError, AnswerToken, DraftProposed, DraftSkipped, DraftVerified, Event
from edge_agent.errors import Cancelled, ConfigError, EdgeAgentError
from edge_agent.runtime.types import Checkpoint, ModelLike, SessionLike

GROUNDING = "grounding"
ANSWERING = "answering"
MODES = (GROUNDING, ANSWERING)

# Sharpness of the rank adjustment (see combined_scores). 1.0: a_j moves linearly in log-rank.
DEFAULT_GAMMA = 1.0

# A draft is cut before the first token whose text would contain one of these: they belong to the
# agent's turn structure, and a prophet writing them means it has left the content it was asked for.
DEFAULT_CUT = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "</answer>", "<answer>", "</think>",
               "<think>", "<tool_call>", "</tool_call>", "<tool_response>")

# An answering draft becomes answer text, which the agent's answer grammar writes as ``[^<]*`` then
# ``</answer>``: a "<" there would be a token the agent could never have generated, so cut before it.
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


def search_weight(ranks: np.ndarray | Sequence[int], n_vocab: int, a0: float, gamma: float = DEFAULT_GAMMA) -> np.ndarray:
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
    skipped: str = ""  # "" (a draft was verified) | "not_ready" | "low_acceptance" | "failed"

    @property
    def accepted_tokens(self) -> tuple[int, ...]:
        return self.draft.tokens[: self.accepted]

    @classmethod
    def empty(cls, mode: str, query: str, *, skipped: str = "", waited: float = 0.0) -> Verification:
        """Nothing drafted or nothing verified: the agent's session was not touched."""
        z = np.zeros(0)
        d = Draft(mode, query, (), z, "", 0.0, waited)
        return cls(d, 0, z, z, z, np.zeros(0, dtype=np.int64), "", 0.0, skipped=skipped)


SKIP_REASONS = ("not_ready", "low_acceptance", "failed")


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
# Costs and the adaptive rule (pure logic; the drafter feeds them measurements)
# --------------------------------------------------------------------------------------------------

# Before anything is measured. PRIOR_ACCEPTANCE: the share of a draft a new chat expects accepted
# (the benchmark's SmolLM2 pair accepts about half at tau 0.05). PRIOR_VERIFY_RATIO: verifying L
# tokens in one decode costs this share of decoding them one by one (measured 0.34-0.48 on 2 cores).
PRIOR_ACCEPTANCE = 0.5
PRIOR_VERIFY_RATIO = 0.4
EMA_WEIGHT = 0.3  # weight of the newest measurement in the running cost estimates
WINDOW = 4  # rounds per mode the adaptive rule looks back on
MIN_ROUNDS_TO_SWITCH_OFF = 2
PROBE_EVERY = 4  # a mode switched off drafts again after this many skipped rounds (acceptance may recover)
MAX_PROBE_GAP = 32  # drafts that never fit in time are probed at most this rarely (the gap doubles)
MIN_DRAFT_LEN = 4


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new


@dataclass
class Costs:
    """Measured costs in seconds (running averages; None until measured). Machine properties: they
    survive :meth:`Drafter.reset` (new questions, new chats).

    ``agent_token``: the agent's time per decoded token (the loop reports its answer generations);
    until one is seen, the prophet's own per-token time times ``agent_cost_ratio`` stands in.
    ``verify_token``: verification time per scored token. ``prefill_new_image`` / ``prefill_same_image``:
    prophet time from starting a draft to its first token, with and without putting an image in.
    """

    agent_cost_ratio: float = 1.0
    agent_token: float | None = None
    prophet_token: float | None = None
    verify_token: float | None = None
    prefill_new_image: float | None = None
    prefill_same_image: float | None = None
    # mode -> seconds from preparing a draft (Drafter.start) to the hook that uses it: how long the
    # agent works meanwhile, i.e. how much drafting can be hidden
    lead: dict[str, float] = field(default_factory=dict)

    def prophet_seconds(self) -> float | None:
        """The prophet's seconds per drafted token: measured, else the agent's scaled by the size ratio."""
        if self.prophet_token is not None:
            return self.prophet_token
        return None if self.agent_token is None else self.agent_token / self.agent_cost_ratio

    def draft_seconds(self, draft_len: int, *, new_image: bool) -> float | None:
        """Expected prophet seconds for a draft of ``draft_len`` tokens, prompt included; None if unknown."""
        pre = self.prefill_new_image if new_image else self.prefill_same_image
        per_tok = self.prophet_seconds()
        if pre is None or per_tok is None:
            return None
        return pre + draft_len * per_tok

    def token_seconds(self, prophet_token: float | None = None) -> float | None:
        """Expected agent seconds per decoded token, or None when nothing is known yet.
        ``prophet_token``: the prophet's rate measured on the draft in flight (when nothing else is)."""
        if self.agent_token is not None:
            return self.agent_token
        rate = self.prophet_token if self.prophet_token is not None else prophet_token
        return None if rate is None else rate * self.agent_cost_ratio

    def verify_seconds(self, n_tokens: int, prophet_token: float | None = None) -> float | None:
        if self.verify_token is not None:
            return self.verify_token * n_tokens
        t = self.token_seconds(prophet_token)
        return None if t is None else PRIOR_VERIFY_RATIO * n_tokens * t

    def break_even(self) -> float:
        """The acceptance below which a draft costs more to verify than its accepted tokens save."""
        t = self.token_seconds()
        if t is None or self.verify_token is None or t <= 0:
            return PRIOR_VERIFY_RATIO
        return min(1.0, self.verify_token / t)

    def saving(self, acceptance: float, draft_len: int, prophet_token: float | None = None) -> float | None:
        """Expected seconds a draft of ``draft_len`` saves the agent: accepted tokens it need not
        decode, less the verification. None when the costs are not known yet."""
        t, v = self.token_seconds(prophet_token), self.verify_seconds(draft_len, prophet_token)
        if t is None or v is None:
            return None
        return acceptance * draft_len * t - v


@dataclass(frozen=True)
class Plan:
    """Whether a mode drafts this round, and how many tokens (decided by :class:`Adaptive`)."""

    use: bool
    draft_len: int
    note: str = ""  # what the rule decided and why, for the events ("" when nothing changed)
    reason: str = "low_acceptance"  # why not, when not ``use``: "low_acceptance" | "not_ready"


class Adaptive:
    """Per-mode acceptance over the chat's last ``WINDOW`` rounds, and what follows from it.

    - off: after at least ``MIN_ROUNDS_TO_SWITCH_OFF`` rounds whose acceptance is below break-even
      (:meth:`Costs.break_even`), the mode does not draft; every ``PROBE_EVERY``-th skipped round it
      drafts once again, so a mode whose drafts become good comes back.
    - shorter drafts: L_d = clamp(ceil(2 x mean accepted tokens per round) + 2, MIN_DRAFT_LEN,
      draft_len): the prophet stops drafting tokens that would be rejected (and verifying costs less).
    ``enabled=False`` pins L_d and never switches a mode off (experiments, ``eval``).
    """

    def __init__(self, draft_len: int, *, enabled: bool = True) -> None:
        self.draft_len = draft_len
        self.enabled = enabled
        self.rounds: dict[str, list[tuple[int, int]]] = {m: [] for m in MODES}  # (drafted, accepted)
        self.off_skips: dict[str, int] = dict.fromkeys(MODES, 0)

    def acceptance(self, mode: str) -> float:
        r = self.rounds[mode]
        drafted = sum(d for d, _ in r)
        return sum(a for _, a in r) / drafted if drafted else PRIOR_ACCEPTANCE

    def record(self, mode: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.rounds[mode] = (self.rounds[mode] + [(drafted, accepted)])[-WINDOW:]
            self.off_skips[mode] = 0

    def plan(self, mode: str, costs: Costs) -> Plan:
        if not self.enabled:
            return Plan(True, self.draft_len)
        r = self.rounds[mode]
        acc, be = self.acceptance(mode), costs.break_even()
        if len(r) >= MIN_ROUNDS_TO_SWITCH_OFF and acc < be:
            if self.off_skips[mode] + 1 < PROBE_EVERY:
                return Plan(False, 0, f"{mode} drafts off: acceptance {acc:.2f} is below break-even {be:.2f}")
            probe = True
        else:
            probe = False
        n = self.draft_len
        if r:
            mean_acc = sum(a for _, a in r) / len(r)
            n = max(MIN_DRAFT_LEN, min(self.draft_len, math.ceil(2 * mean_acc) + 2))
        note = f"probing {mode} drafts again (acceptance {acc:.2f})" if probe else ""
        if n < self.draft_len:
            note = (note + "; " if note else "") + f"L_d {n} of {self.draft_len} (recent acceptance {acc:.2f})"
        return Plan(True, n, note)

    def skipped(self, mode: str) -> None:
        self.off_skips[mode] += 1


def prophet_threads(agent_threads: int, cores: int) -> int:
    """Threads for the prophet, which drafts while the agent decodes: the cores the agent's decoding
    leaves free, at least 1, at most half the machine. On 2 cores (agent decodes on 1): 1. More
    threads than cores make llama.cpp's spin-waiting threads stall each other (tens of times slower)."""
    return max(1, min(cores - agent_threads, cores // 2))


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


def _image_key(image: bytes | None) -> str:
    return hashlib.blake2b(image, digest_size=16).hexdigest() if image is not None else ""


# The ``seprod_tau`` setting's default (edge_agent.config; a test keeps the two equal): at 0.05 the
# benchmark's SmolLM2 pair accepted half of its drafts, at 0.1 a fifth.
DEFAULT_TAU = 0.05


# --------------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------------


class _Job:
    """A draft submitted to the worker, and its progress (written by the worker, read by the caller)."""

    def __init__(self, mode: str, query: str, image: bytes | None, plan: Plan) -> None:
        self.mode, self.query, self.image, self.plan = mode, query, image, plan
        self.key = (mode, query, _image_key(image))
        self.cancel = threading.Event()
        self.future: Future[Draft] = Future()
        self.submitted = time.perf_counter()
        self.prepared = False  # submitted by Drafter.start (ahead of its hook)
        self.started: float | None = None
        self.new_image = False
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.n_tokens = 0

    def on_token(self, piece: str, token: int) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.n_tokens += 1

    def rate(self) -> float | None:
        """The prophet's seconds per token on this draft so far (None before its second token)."""
        if self.first_token is not None and self.last_token is not None and self.n_tokens > 1:
            return (self.last_token - self.first_token) / (self.n_tokens - 1)
        return None

    def expected_remaining(self, costs: Costs, now: float) -> float | None:
        """Seconds until the draft is ready, from its progress and measured prophet costs; None if unknown."""
        per_tok = self.rate() or costs.prophet_token
        if per_tok is None:
            return None
        left = max(0, self.plan.draft_len - self.n_tokens) * per_tok
        if self.first_token is not None:
            return left
        prefill = costs.prefill_new_image if self.new_image or self.started is None else costs.prefill_same_image
        if prefill is None:
            return None
        since = now - self.started if self.started is not None else 0.0
        return max(0.0, prefill - since) + left


class Drafter:
    """Drafts with the prophet model and verifies drafts on the agent's session.

    ``prophet``: a loaded ModelLike sharing the agent's tokenizer (checked by whoever loads it).
    ``agent_vocab``: V of the agent's logits (for normalising ranks).
    ``draft_len`` (L_d), ``tau``, ``a0``: the SeProD settings; ``gamma``: see :func:`search_weight`.
    ``adaptive``: per-mode acceptance switches modes off and shortens L_d (:class:`Adaptive`); False
    pins L_d and tau (experiments).
    ``background``: run the prophet in a worker thread so :meth:`start` can prepare drafts while the
    agent evaluates its own context. With ``False`` the work still happens in that one thread (the
    prophet model is only ever touched by it) but callers only submit and wait.
    ``block``: at a hook, wait for a draft that is not ready whatever it costs (default: only when not
    ``background``); else wait only while the expected saving exceeds the expected wait, and fit
    prepared drafts to the time before their hook (:meth:`_fit`).
    ``agent_cost_ratio``: the agent's decode time per token over the prophet's, used until the agent's
    own is measured (the engine passes the ratio of the two weight sizes: decoding is memory-bound).
    ``agent_lead``: when the draft starts with content but the agent's own greedy next token is pure
    whitespace, that one token goes first (the agent's, accepted as its own) and the draft is scored
    after it. Why: the prophet answers a bare question, the agent writes inside its format (e.g.
    ``<answer>\\n``); without this a draft is rejected at its first token for a newline, not for its
    content (SmolLM2 after ``<answer>``: 0.85-0.89 on "\\n", p_s of the draft's first token 0.01-0.15;
    acceptance at tau 0.05 went from 0.39 to 0.67 on the benchmark). It is the agent's greedy choice,
    so under greedy decoding the result is what the agent would have generated.

    Hook points for the agent loop (all generators ``yield``-ing events and returning a
    :class:`Verification`, use ``v = yield from drafter.ground(...)``):
    - :meth:`start` when the current image changes (episode start, after a zoom): prepares drafts;
    - :meth:`ground` right after ``<think>\\n`` of the turn after a zoom: accepted tokens open the
      think block (SSR rationale scoring then conditions on them); ``steer`` follows them;
    - :meth:`answer` right after ``<answer>`` (or wherever the answer text starts): accepted tokens
      are the start of the answer (never more than ``max_tokens``); the loop continues from them;
    - :meth:`observe_decode` after the agent decodes (its time per token prices a draft).
    """

    def __init__(
        self,
        prophet: ModelLike,
        *,
        agent_vocab: int,
        draft_len: int = 16,
        tau: float = DEFAULT_TAU,
        a0: float = 0.5,
        gamma: float = DEFAULT_GAMMA,
        adaptive: bool = True,
        background: bool = True,
        block: bool | None = None,
        agent_cost_ratio: float = 1.0,
        cut: Sequence[str] = DEFAULT_CUT,
        answer_cut: Sequence[str] = ANSWER_CUT,
        agent_lead: bool = True,
    ) -> None:
        if draft_len < 1:
            raise ConfigError("Setting seprod_draft_len must be at least 1.")
        if not 0.0 <= a0 <= 1.0:
            raise ConfigError(f"Setting seprod_a0 must be between 0 and 1, not {a0}.")
        if tau < 0 or tau > 1:
            raise ConfigError(f"Setting seprod_tau must be between 0 and 1 (s_j is a probability), not {tau}.")
        self.prophet = prophet
        self.agent_vocab = agent_vocab
        self.tau = tau
        self.a0 = a0
        self.gamma = gamma
        self.background = background
        self._block = block
        self.cut = tuple(cut)
        self.answer_cut = tuple(answer_cut)
        self.agent_lead = agent_lead
        self.stats = SeProDStats()
        self._evaluated_before = 0  # prophet tokens evaluated by sessions already replaced
        self.costs = Costs(agent_cost_ratio=agent_cost_ratio)
        self.adaptive = Adaptive(draft_len, enabled=adaptive)
        self._late: dict[str, int] = {}  # mode -> prepared drafts skipped in a row for not fitting in time
        self._probe_gap: dict[str, int] = {}  # mode -> skips before the next probe (doubles while probes fail)
        self._warm = False  # the prophet has drafted once (its first draft is not measured)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prophet")
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], _Job] = {}
        # prophet-side cache (worker thread only): the session, and a checkpoint after the image
        self._session: SessionLike | None = None
        self._image_key: str | None = None
        self._after_image: Checkpoint | None = None

    @property
    def draft_len(self) -> int:
        """L_d, the most tokens a draft has (the settings screen may change it)."""
        return self.adaptive.draft_len

    @draft_len.setter
    def draft_len(self, n: int) -> None:
        if n < 1:
            raise ConfigError("Setting seprod_draft_len must be at least 1.")
        self.adaptive.draft_len = n

    @property
    def block(self) -> bool:
        return (not self.background) if self._block is None else self._block

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        self._drop(lambda job: True)
        self._pool.shutdown(wait=True)

    @property
    def tokens_evaluated(self) -> int:
        """Prompt tokens the prophet has evaluated so far (its images in embeddings), all questions."""
        s = self._session
        return self._evaluated_before + int(getattr(s, "n_evaluated", 0))  # a fake session has no counter

    def totals(self) -> dict[str, float]:
        """This question's SeProD counters, for ``FinalAnswer.totals``."""
        return self.stats.totals()

    def reset(self, *, new_chat: bool = False) -> None:
        """A new question: forget prepared drafts and the episode's stats. ``new_chat``: also forget
        the chat's acceptance (measured costs are the machine's and stay)."""
        self._drop(lambda job: True)
        self.stats = SeProDStats()
        if new_chat:
            self.adaptive = Adaptive(self.adaptive.draft_len, enabled=self.adaptive.enabled)

    def _drop(self, which) -> None:
        with self._lock:
            for k in [k for k, job in self._pending.items() if which(job)]:
                self._cancel(self._pending.pop(k))

    @staticmethod
    def _cancel(job: _Job) -> None:
        job.cancel.set()  # a running draft stops at its next token; a queued one never starts

    # ---- drafting (prophet side) --------------------------------------------------------------
    def start(self, *, image: bytes | None, question: str, target: str | None = None) -> None:
        """Prepare drafts for a new current image in the background (no-op when not background).

        ``target`` given (after a zoom): the grounding draft first, then the answering draft. A mode the
        adaptive rule has switched off is not drafted.
        """
        if not self.background:
            return
        key = _image_key(image)
        self._drop(lambda job: job.key[2] != key)  # drafts for an earlier image are never asked for again
        ahead = [0.0]  # expected prophet seconds of the drafts queued before this one
        new_image = [key != self._image_key and image is not None]
        if target is not None:
            self._submit(GROUNDING, grounding_query(target), image, ahead=ahead, new_image=new_image)
        self._submit(ANSWERING, answering_query(question), image, ahead=ahead, new_image=new_image)

    def draft(self, mode: str, query: str, image: bytes | None) -> Draft:
        """The prophet's greedy draft of up to L_d tokens for (image, query); blocks until ready."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        t0 = time.perf_counter()
        job = self._take(mode, query, image) or self._submit(mode, query, image, plan=Plan(True, self.draft_len), keep=False)
        d = job.future.result()
        return dataclasses.replace(d, waited=time.perf_counter() - t0)

    def _take(self, mode: str, query: str, image: bytes | None) -> _Job | None:
        with self._lock:
            return self._pending.pop((mode, query, _image_key(image)), None)

    def _submit(self, mode: str, query: str, image: bytes | None, *, plan: Plan | None = None,
                keep: bool = True, ahead: list[float] | None = None, new_image: list[bool] | None = None) -> _Job:
        """Queue a draft (``keep``: remembered for the hook; ``ahead``/``new_image``: prepared by
        :meth:`start`, fitted to the time before its hook). A plan that does not draft queues nothing."""
        key = (mode, query, _image_key(image))
        with self._lock:
            if keep and key in self._pending:
                return self._pending[key]
            plan = plan or self.adaptive.plan(mode, self.costs)
            if ahead is not None and new_image is not None:
                plan = self._fit(mode, plan, ahead, new_image)
            job = _Job(mode, query, image, plan)
            job.prepared = ahead is not None
            if keep:
                self._pending[key] = job
            if plan.use:
                self._pool.submit(self._run, job)
            return job

    def _fit(self, mode: str, plan: Plan, ahead: list[float], new_image: list[bool]) -> Plan:
        """A prepared draft fitted to the time before its hook: the measured lead time plus the wait its
        saving pays for. Shorter when only part fits; none (reason "not_ready", no prophet work) when
        fewer than ``MIN_DRAFT_LEN`` tokens would be ready, except for a short probe after
        ``PROBE_EVERY`` such skips (costs change: the machine may be less busy), the gap doubling up to
        ``MAX_PROBE_GAP`` while no draft is used. Updates ``ahead`` (the worker runs one draft at a time)."""
        c = self.costs
        if not plan.use or self.block or not self.adaptive.enabled:
            return plan
        lead, per_tok = c.lead.get(mode), c.prophet_seconds()
        full = c.draft_seconds(plan.draft_len, new_image=new_image[0])
        if lead is None or per_tok is None or full is None or per_tok <= 0:
            return plan  # nothing measured yet: draft, and measure
        wait = max(0.0, c.saving(self.adaptive.acceptance(mode), plan.draft_len) or 0.0)
        prompt = full - plan.draft_len * per_tok
        fits = int((lead + wait - ahead[0] - prompt) / per_tok)
        if fits < min(MIN_DRAFT_LEN, plan.draft_len):
            self._late[mode] = self._late.get(mode, 0) + 1
            gap = self._probe_gap.get(mode, PROBE_EVERY)
            if self._late[mode] < gap:
                return Plan(False, 0, f"the {mode} draft would not be ready in time: it needs ~{full * 1e3:.0f} ms, "
                            f"the agent gets there in ~{lead * 1e3:.0f} ms", reason="not_ready")
            # a short probe; the next one comes twice as late unless a draft is used meanwhile
            self._probe_gap[mode] = min(2 * gap, MAX_PROBE_GAP)
            fits, note = min(MIN_DRAFT_LEN, plan.draft_len), f"probing whether a {mode} draft is ready in time"
        else:
            note = plan.note
        self._late[mode] = 0
        if fits < plan.draft_len:
            plan = Plan(True, fits, (note + "; " if note else "") + f"L_d {fits} of {plan.draft_len}: what is ready "
                        f"in the ~{lead * 1e3:.0f} ms before the agent needs it")
        elif note != plan.note:
            plan = Plan(True, plan.draft_len, note)
        ahead[0] += (c.draft_seconds(plan.draft_len, new_image=new_image[0]) or 0.0)
        new_image[0] = False
        return plan

    def _run(self, job: _Job) -> None:
        """Worker thread: run one job, its result or error into its future."""
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            if job.cancel.is_set():
                raise Cancelled()
            job.future.set_result(self._draft_now(job))
        except BaseException as e:  # handed to whoever waits on the future
            job.future.set_exception(e)

    def _draft_now(self, job: _Job) -> Draft:
        """Worker thread only. Prompt: ``<|im_start|>user\\n[image]query<|im_end|>\\n<|im_start|>assistant\\n``."""
        t0 = job.started = time.perf_counter()
        mode, query, image = job.mode, job.query, job.image
        key = job.key[2]
        s = self._session
        if s is None or key != self._image_key or self._after_image is None:
            job.new_image = image is not None
            if s is not None:
                self._evaluated_before += int(getattr(s, "n_evaluated", 0))
            self._session = None  # until the image is in: a failure here leaves no half-built session
            s = self.prophet.session()  # clears the prophet's KV cache
            s.append_text("<|im_start|>user\n", special=True)
            if image is not None:
                s.append_image(image)
            self._session, self._image_key, self._after_image = s, key, s.checkpoint()
        else:
            s.rollback(self._after_image)  # same image: its chunks stay in the cache
        s.append_text(query, special=False)  # the user's text never becomes control tokens
        s.append_text("<|im_end|>\n<|im_start|>assistant\n", special=True)
        gen = s.generate(max_tokens=job.plan.draft_len, temperature=0.0, on_token=job.on_token, cancel=job.cancel)
        if gen.stop_reason == "cancelled":
            self._measure(job, cancelled=True)  # a cancelled draft still says what drafting costs
            raise Cancelled()
        tokens = list(gen.tokens)
        logprobs = list(gen.logprobs)
        if len(logprobs) != len(tokens):
            raise RuntimeError("runtime returned a Generation without one logprob per token")
        self._measure(job)
        if gen.stop_reason == "eos" and tokens:  # the end-of-turn token is the prophet's, not content
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        n = self._cut_length(tokens, self.answer_cut if mode == ANSWERING else self.cut)
        tokens, logprobs = tokens[:n], logprobs[:n]
        text = self._text(tokens)
        return Draft(mode, query, tuple(tokens), np.asarray(logprobs, dtype=np.float64), text,
                     time.perf_counter() - t0, draft_len=job.plan.draft_len)

    def _measure(self, job: _Job, *, cancelled: bool = False) -> None:
        """Prophet costs from a draft's progress. A draft cancelled before its first token gives a lower
        bound of its prompt time (else drafts that are always cancelled would never be priced, and the
        prophet would keep drafting them for nothing)."""
        c = self.costs
        if not self._warm:  # the prophet's first draft pages its weights in: not what drafts cost
            self._warm = True
            return
        if job.started is not None and (job.first_token is not None or cancelled):
            prefill = (job.first_token or time.perf_counter()) - job.started
            if job.new_image:
                c.prefill_new_image = _ema(c.prefill_new_image, prefill)
            else:
                c.prefill_same_image = _ema(c.prefill_same_image, prefill)
        if job.n_tokens > 1 and job.first_token is not None and job.last_token is not None:
            c.prophet_token = _ema(c.prophet_token, (job.last_token - job.first_token) / (job.n_tokens - 1))

    def _text(self, tokens: Sequence[int], *, special: bool = False) -> str:
        if not tokens:
            return ""
        if special:  # render control tokens too (runtime.Model takes ``special``; the protocol does not)
            try:
                return self.prophet.detokenize(list(tokens), special=True)  # type: ignore[call-arg]
            except TypeError:
                pass
        return self.prophet.detokenize(list(tokens))

    def _cut_length(self, tokens: list[int], cut: Sequence[str]) -> int:
        """Tokens whose text ends before the first marker of ``cut``. O(L) detokenizes of <= L tokens."""
        if not cut:
            return len(tokens)
        for n in range(1, len(tokens) + 1):
            text = self._text(tokens[:n], special=True)
            hits = [text.find(c) for c in cut if c in text]
            if hits:
                at = min(hits)
                k = n - 1  # the longest prefix whose text stops before the marker begins
                while k > 0 and len(self._text(tokens[:k], special=True)) > at:
                    k -= 1
                return k
        return len(tokens)

    # ---- verification (agent side, caller's thread) --------------------------------------------
    def verify(self, session: SessionLike, draft: Draft, *, max_tokens: int | None = None) -> Verification:
        """Score the whole draft in one batched decode, accept the prefix, put it in the agent's cache.

        ``max_tokens``: the most tokens (the agent's lead included) that may enter the agent's
        session: the draft is cut to fit (an answer's token budget).
        """
        t0 = time.perf_counter()
        tokens = draft.tokens
        lead = self._lead_in(session, draft) if tokens else ()
        if max_tokens is not None:
            if max_tokens <= len(lead):
                lead = ()
            tokens = tokens[: max(0, max_tokens - len(lead))]
        L = len(tokens)
        if L == 0:
            v = Verification.empty(draft.mode, draft.query)
            v.draft, v.seconds = draft, time.perf_counter() - t0
            return v
        n = len(lead)
        cand = list(lead) + list(tokens)  # the lead rides in the same decode: no extra one
        (sc,) = session.score([cand], keep=True)  # keep the scored cells so the prefix can be adopted
        logp_s = np.asarray(sc.logprobs, dtype=np.float64)[n:]
        ranks = np.asarray(sc.ranks, dtype=np.int64)[n:]
        weights = search_weight(ranks, self.agent_vocab, self.a0, self.gamma)
        scores = combined_scores(logp_s, draft.logprobs[:L], ranks, self.agent_vocab, self.a0, self.gamma)
        k = accepted_length(scores, self.tau)
        how = self._adopt(session, cand, n + k)
        text = self._text(tokens[:k])
        seconds = time.perf_counter() - t0
        self.costs.verify_token = _ema(self.costs.verify_token, seconds / len(cand))
        if L < len(draft.tokens):
            draft = dataclasses.replace(draft, tokens=tuple(tokens), logprobs=draft.logprobs[:L],
                                        text=self._text(tokens))
        return Verification(draft, k, scores, weights, logp_s, ranks, text, seconds, how, lead)

    def _lead_in(self, session: SessionLike, draft: Draft) -> tuple[int, ...]:
        """The agent's own greedy whitespace token before the draft, or () (see ``agent_lead``).

        Read from the context's next-token logits (already computed: no decode); the token is scored
        and adopted with the draft, in the same batch.
        """
        if not self.agent_lead or not self._text(draft.tokens[:1], special=True).strip():
            return ()
        t = int(np.argmax(session.next_logprobs()))  # (V,)
        piece = self._text([t], special=True)
        if not piece or piece.strip():  # content, or a control token (renders empty): no lead
            return ()
        return (t,)

    @staticmethod
    def _adopt(session: SessionLike, tokens: Sequence[int], k: int) -> str:
        """Make the first k scored tokens part of seq 0, as if generated.

        ``Session.adopt(0, k)`` gives seq 0 the scoring pass's KV cells (metadata only, no decode) and
        the logits row after token k-1 (the agent's own next-token distribution: where it continues
        sampling). k == 0 still calls it, so the kept candidate cells are dropped.
        """
        session.adopt(0, k)
        return "adopted" if k else "none"

    def observe_decode(self, seconds: float, tokens: int) -> None:
        """The agent decoded ``tokens`` tokens in ``seconds`` (its answer): prices later drafts."""
        if tokens >= 2 and seconds > 0:
            self.costs.agent_token = _ema(self.costs.agent_token, seconds / tokens)

    # ---- hooks for the loop (generators of events) --------------------------------------------
    def ground(
        self, session: SessionLike, *, turn: int, image: bytes | None, target: str
    ) -> Generator[Event, None, Verification]:
        """Grounding round after a zoom: call right after the think block opens. ``target``: the zoom
        label the agent wrote (or the question), cleaned by :func:`clean_label`. The returned value
        carries the prophet's verdict; after an accepted "no", ``steer`` is text for the loop to append."""
        return (yield from self._round(session, turn=turn, mode=GROUNDING, query=grounding_query(target), image=image))

    def answer(
        self, session: SessionLike, *, turn: int, image: bytes | None, question: str, max_tokens: int | None = None
    ) -> Generator[Event, None, Verification]:
        """Answering round: call where the answer text starts; yields the accepted text as an
        ``AnswerToken(from_prophet=True)``; the loop then continues generating the answer.
        ``max_tokens``: the answer's token budget (lead + accepted tokens never exceed it)."""
        v = yield from self._round(session, turn=turn, mode=ANSWERING, query=answering_query(question), image=image,
                                   max_tokens=max_tokens)
        if v.accepted_text:
            yield AnswerToken(turn=turn, text=v.accepted_text, from_prophet=True)
        return v

    def _round(
        self, session: SessionLike, *, turn: int, mode: str, query: str, image: bytes | None,
        max_tokens: int | None = None,
    ) -> Generator[Event, None, Verification]:
        job = self._take(mode, query, image)
        if job is None:  # not prepared by start(): plan now, draft now
            job = self._submit(mode, query, image, keep=False)
        elif job.prepared:  # how long the agent worked between preparing the draft and needing it
            self.costs.lead[mode] = _ema(self.costs.lead.get(mode), time.perf_counter() - job.submitted)
        if not job.plan.use:
            reason = job.plan.reason
            if reason == "low_acceptance":
                self.adaptive.skipped(mode)
            self.stats.skip(reason, 0.0)
            yield DraftSkipped(turn=turn, mode=mode, reason=reason, detail=job.plan.note)
            return Verification.empty(mode, query, skipped=reason)
        t0 = time.perf_counter()
        ready = job.future.done()
        if not ready and not self.block:
            reason = self._wait(job)
            if reason:
                self._cancel(job)
                waited = time.perf_counter() - t0
                self.stats.skip("not_ready", waited)
                yield DraftSkipped(turn=turn, mode=mode, reason="not_ready", detail=reason, waited=waited)
                return Verification.empty(mode, query, skipped="not_ready", waited=waited)
        try:
            d = job.future.result()
        except EdgeAgentError as e:
            # the prophet failed (e.g. its context cannot hold this image): the agent answers without a
            # draft; the person sees why. Bugs (anything else) propagate.
            self.stats.skip("failed", 0.0)
            yield AgentError(turn=turn, title=e.title, message=f"The prophet could not draft ({e.message}); "
                             "continuing without it.", fatal=False)
            return Verification.empty(mode, query, skipped="failed")
        d = dataclasses.replace(d, waited=0.0 if ready else time.perf_counter() - t0)
        yield DraftProposed(turn=turn, mode=mode, text=d.text, tokens=d.tokens, seconds=d.seconds, waited=d.waited,
                            draft_len=d.draft_len, note=job.plan.note)
        v = self.verify(session, d, max_tokens=max_tokens)
        if mode == GROUNDING:
            v.verdict, end = parse_verdict(v.draft.text)
            v.verdict_accepted = bool(v.verdict) and len(v.accepted_text) >= end
            if v.verdict == "no" and v.verdict_accepted:
                v.steer = STEER_ELSEWHERE
        self.stats.add(v)
        self.adaptive.record(mode, len(v.draft.tokens), v.accepted)
        self._probe_gap.pop(mode, None)  # a draft was used: probe at the normal rate again
        yield DraftVerified(
            turn=turn, mode=mode, accepted=v.accepted, drafted=len(v.draft.tokens), accepted_text=v.accepted_text,
            scores=tuple(float(x) for x in v.scores), seconds=v.seconds, lead=len(v.lead), verdict=v.verdict,
            verdict_accepted=v.verdict_accepted,
        )
        return v

    def _wait(self, job: _Job) -> str:
        """Wait for a draft that is not ready while that is expected to pay; "" when it is ready, else
        why the agent goes on without it."""
        saving = self.costs.saving(self.adaptive.acceptance(job.mode), job.plan.draft_len, job.rate())
        if saving is None:
            return "the draft is not ready and its saving cannot be priced yet (nothing measured)"
        if saving <= 0:
            return f"the draft is not ready and would save nothing (expected {saving * 1e3:.0f} ms)"
        remaining = job.expected_remaining(self.costs, time.perf_counter())
        if remaining is not None and remaining > saving:
            return (f"the draft is not ready: expected wait {remaining * 1e3:.0f} ms > expected saving "
                    f"{saving * 1e3:.0f} ms")
        try:
            job.future.exception(timeout=saving)
        except FutureTimeout:
            return f"the draft was not ready within its expected saving ({saving * 1e3:.0f} ms)"
        return ""
