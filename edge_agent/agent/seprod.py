"""SeProD (self-prophetic decoding): a base "prophet" model drafts tokens, the agent verifies them.

What this module knows:
- the acceptance rule (pure numpy, see :func:`combined_scores` for the formula and why);
- what the prophet is shown: ONLY the current image (the latest crop, or the original; none for
  text-only models) and a mode query, in the shared ChatML format. Never the agent's text;
- how a draft is verified: one batched teacher-forced ``score`` call on the agent's session
  (log p_s and ranks of every draft token in one decode), then the accepted prefix is put into the
  agent's KV cache exactly as if the agent had generated it (adopted from the scoring pass when the
  runtime can, else evaluated); the agent then continues from its own distribution. "Exactly": same
  tokens, positions and cells; the values equal sequential decoding on F32 weights, and on quantized
  weights up to the batch-shape rounding llama.cpp has anyway (near-ties can flip later greedy picks);
- that the agent writes its own format whitespace before a draft (``Drafter(agent_lead=True)``);
- the events it yields (DraftProposed, DraftVerified, AnswerToken(from_prophet=True), and a non-fatal
  AgentError when the prophet cannot draft).

What it does not know: llama.cpp (it talks to ``runtime.types.ModelLike`` / ``SessionLike``), where in
the agent's turn a draft goes (the loop decides: a grounding draft opens the think block after a
zoom, an answering draft is the start of the answer), grammars, the UI. The prophet model is used
from one worker thread only (so drafts can be prepared while the agent works; see ``Drafter.start``).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from edge_agent.agent.events import AgentError, AnswerToken, DraftProposed, DraftVerified, Event
from edge_agent.errors import ConfigError, EdgeAgentError
from edge_agent.runtime.types import ModelLike, SessionLike

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
    waited: float = 0.0  # time the caller blocked for it (0 when it was prepared in the background)


@dataclass
class Verification:
    """The agent's verdict on a draft: ``accepted`` leading tokens are now in the agent's KV cache."""

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

    @property
    def accepted_tokens(self) -> tuple[int, ...]:
        return self.draft.tokens[: self.accepted]


@dataclass
class SeProDStats:
    """Running totals over an episode (for ``FinalAnswer.totals`` and the benchmark)."""

    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    wait_seconds: float = 0.0
    verify_seconds: float = 0.0
    by_mode: dict[str, list[int]] = field(default_factory=dict)  # mode -> [drafted, accepted]

    def add(self, v: Verification) -> None:
        self.drafts += 1
        self.drafted_tokens += len(v.draft.tokens)
        self.accepted_tokens += v.accepted
        self.draft_seconds += v.draft.seconds
        self.wait_seconds += v.draft.waited
        self.verify_seconds += v.seconds
        m = self.by_mode.setdefault(v.draft.mode, [0, 0])
        m[0] += len(v.draft.tokens)
        m[1] += v.accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def totals(self) -> dict[str, float]:
        return {
            "seprod_drafts": float(self.drafts),
            "seprod_drafted_tokens": float(self.drafted_tokens),
            "seprod_accepted_tokens": float(self.accepted_tokens),
            "seprod_acceptance_rate": self.acceptance_rate,
            "seprod_draft_seconds": self.draft_seconds,
            "seprod_wait_seconds": self.wait_seconds,
            "seprod_verify_seconds": self.verify_seconds,
        }


# --------------------------------------------------------------------------------------------------
# Prophet prompts (what the prophet sees: the image and this query, nothing else)
# --------------------------------------------------------------------------------------------------


def grounding_query(target: str) -> str:
    """Q^g: does the crop contain the target? true/false first, then its details if true."""
    target = " ".join(target.split()) or "the object in question"
    return (
        f"Does this image contain {target}? Reply with true or false first. "
        f"If true, then describe the details of {target} that you can see."
    )


def answering_query(question: str) -> str:
    """The answering mode's query is the user's question, as asked."""
    return question.strip()


def _image_key(image: bytes | None) -> str:
    return hashlib.blake2b(image, digest_size=16).hexdigest() if image is not None else ""


# --------------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------------


class Drafter:
    """Drafts with the prophet model and verifies drafts on the agent's session.

    ``prophet``: a loaded ModelLike sharing the agent's tokenizer (checked by whoever loads it).
    ``agent_vocab``: V of the agent's logits (for normalising ranks).
    ``draft_len`` (L_d), ``tau``, ``a0``: the SeProD settings; ``gamma``: see :func:`search_weight`.
    ``background``: run the prophet in a worker thread so :meth:`start` can prepare drafts while the
    agent evaluates its own context. With ``False`` the work still happens in that one thread (the
    prophet model is only ever touched by it) but callers only submit and wait.
    ``agent_lead``: when the draft starts with content but the agent's own greedy next token is pure
    whitespace, that one token goes first (the agent's, accepted as its own) and the draft is scored
    after it. Why: the prophet answers a bare question, the agent writes inside its format (e.g.
    ``<answer>\n``); without this a draft is rejected at its first token for a newline, not for its
    content (SmolLM2 after ``<answer>``: 0.85-0.89 on "\n", p_s of the draft's first token 0.01-0.15;
    acceptance at tau 0.05 went from 0.39 to 0.67 on the benchmark). It is the agent's greedy choice,
    so under greedy decoding the result is what the agent would have generated.

    Hook points for the agent loop (all generators ``yield``-ing events and returning a value, use
    ``v = yield from drafter.ground(...)``):
    - :meth:`start` when the current image changes (episode start, after a zoom): prepares drafts;
    - :meth:`ground` right after ``<think>\\n`` of the turn after a zoom: accepted tokens open the
      think block (SSR rationale scoring then conditions on them);
    - :meth:`answer` right after ``<answer>`` (or wherever the answer text starts): accepted tokens
      are the start of the answer; the loop continues generating from them.
    """

    def __init__(
        self,
        prophet: ModelLike,
        *,
        agent_vocab: int,
        draft_len: int = 16,
        tau: float = 0.1,
        a0: float = 0.5,
        gamma: float = DEFAULT_GAMMA,
        background: bool = True,
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
        self.draft_len = draft_len
        self.tau = tau
        self.a0 = a0
        self.gamma = gamma
        self.background = background
        self.cut = tuple(cut)
        self.answer_cut = tuple(answer_cut)
        self.agent_lead = agent_lead
        self.stats = SeProDStats()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prophet")
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], Future[Draft]] = {}
        # prophet-side cache (worker thread only): the session, and a checkpoint after the image
        self._session: SessionLike | None = None
        self._image_key: str | None = None
        self._after_image = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            for f in self._pending.values():
                f.cancel()
            self._pending.clear()
        self._pool.shutdown(wait=True)

    def reset(self) -> None:
        """Forget prepared drafts (a new episode)."""
        with self._lock:
            for f in self._pending.values():
                f.cancel()
            self._pending.clear()
        self.stats = SeProDStats()

    # ---- drafting (prophet side) --------------------------------------------------------------
    def start(self, *, image: bytes | None, question: str, target: str | None = None) -> None:
        """Prepare drafts for a new current image in the background (no-op when not background).

        ``target`` given (after a zoom): the grounding draft first, then the answering draft.
        """
        if not self.background:
            return
        key = _image_key(image)
        with self._lock:  # drafts for an earlier image are never asked for again: don't spend on them
            for k in [k for k in self._pending if k[2] != key]:
                self._pending.pop(k).cancel()
        if target is not None:
            self._submit(GROUNDING, grounding_query(target), image)
        self._submit(ANSWERING, answering_query(question), image)

    def draft(self, mode: str, query: str, image: bytes | None) -> Draft:
        """The prophet's greedy draft of up to L_d tokens for (image, query); blocks until ready."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        t0 = time.perf_counter()
        fut = self._submit(mode, query, image, take=True)
        d = fut.result()
        waited = time.perf_counter() - t0
        return Draft(d.mode, d.query, d.tokens, d.logprobs, d.text, d.seconds, waited)

    def _submit(self, mode: str, query: str, image: bytes | None, *, take: bool = False) -> Future[Draft]:
        key = (mode, query, _image_key(image))
        with self._lock:
            fut = self._pending.pop(key, None) if take else self._pending.get(key)
            if fut is None:
                fut = self._pool.submit(self._draft_now, mode, query, image)
                if not take:
                    self._pending[key] = fut
            return fut

    def _draft_now(self, mode: str, query: str, image: bytes | None) -> Draft:
        """Worker thread only. Prompt: ``<|im_start|>user\\n[image]query<|im_end|>\\n<|im_start|>assistant\\n``."""
        t0 = time.perf_counter()
        key = _image_key(image)
        s = self._session
        if s is None or key != self._image_key or self._after_image is None:
            s = self.prophet.session()  # clears the prophet's KV cache
            s.append_text("<|im_start|>user\n", special=True)
            if image is not None:
                s.append_image(image)
            self._session, self._image_key, self._after_image = s, key, s.checkpoint()
        else:
            s.rollback(self._after_image)  # same image: its chunks stay in the cache
        s.append_text(query, special=False)  # the user's text never becomes control tokens
        s.append_text("<|im_end|>\n<|im_start|>assistant\n", special=True)
        gen = s.generate(max_tokens=self.draft_len, temperature=0.0)
        tokens = list(gen.tokens)
        logprobs = list(gen.logprobs)
        if len(logprobs) != len(tokens):
            raise RuntimeError("runtime returned a Generation without one logprob per token")
        if gen.stop_reason == "eos" and tokens:  # the end-of-turn token is the prophet's, not content
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        n = self._cut_length(tokens, self.answer_cut if mode == ANSWERING else self.cut)
        tokens, logprobs = tokens[:n], logprobs[:n]
        text = self._text(tokens)
        return Draft(mode, query, tuple(tokens), np.asarray(logprobs, dtype=np.float64), text,
                     time.perf_counter() - t0)

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
    def verify(self, session: SessionLike, draft: Draft) -> Verification:
        """Score the whole draft in one batched decode, accept the prefix, put it in the agent's cache."""
        t0 = time.perf_counter()
        L = len(draft.tokens)
        if L == 0:
            empty = np.zeros(0)
            return Verification(draft, 0, empty, empty, empty, np.zeros(0, dtype=np.int64), "",
                                time.perf_counter() - t0)
        lead = self._lead_in(session, draft)
        n = len(lead)
        cand = list(lead) + list(draft.tokens)  # the lead rides in the same decode: no extra one
        adopt = getattr(session, "adopt", None)
        if adopt is not None:  # runtime.Session: keep the scored cells so the prefix can be adopted
            (sc,) = session.score([cand], keep=True)  # type: ignore[call-arg]
        else:
            (sc,) = session.score([cand])
        logp_s = np.asarray(sc.logprobs, dtype=np.float64)[n:]
        ranks = np.asarray(sc.ranks, dtype=np.int64)[n:]
        weights = search_weight(ranks, self.agent_vocab, self.a0, self.gamma)
        scores = combined_scores(logp_s, draft.logprobs, ranks, self.agent_vocab, self.a0, self.gamma)
        k = accepted_length(scores, self.tau)
        how = self._adopt(session, cand, n + k)
        text = self._text(draft.tokens[:k])
        return Verification(draft, k, scores, weights, logp_s, ranks, text, time.perf_counter() - t0, how, lead)

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
        sampling). k == 0 still calls it, so the kept candidate cells are dropped. Sessions without
        ``adopt`` evaluate the tokens (same state, one extra decode of k tokens).
        """
        adopt = getattr(session, "adopt", None)
        if adopt is not None:
            adopt(0, k)
            return "adopted" if k else "none"
        if k == 0:
            return "none"
        session.append_tokens(list(tokens[:k]))
        return "evaluated"

    # ---- hooks for the loop (generators of events) --------------------------------------------
    def ground(
        self, session: SessionLike, *, turn: int, image: bytes | None, target: str
    ) -> Generator[Event, None, Verification]:
        """Grounding round after a zoom: call right after the think block opens."""
        return (yield from self._round(session, turn=turn, mode=GROUNDING, query=grounding_query(target), image=image))

    def answer(
        self, session: SessionLike, *, turn: int, image: bytes | None, question: str
    ) -> Generator[Event, None, Verification]:
        """Answering round: call where the answer text starts; yields the accepted text as an
        ``AnswerToken(from_prophet=True)``; the loop then continues generating the answer."""
        v = yield from self._round(session, turn=turn, mode=ANSWERING, query=answering_query(question), image=image)
        if v.accepted_text:
            yield AnswerToken(turn=turn, text=v.accepted_text, from_prophet=True)
        return v

    def _round(
        self, session: SessionLike, *, turn: int, mode: str, query: str, image: bytes | None
    ) -> Generator[Event, None, Verification]:
        try:
            d = self.draft(mode, query, image)
        except EdgeAgentError as e:
            # the prophet failed (e.g. its context cannot hold this image): the agent answers without a
            # draft; the person sees why. Bugs (anything else) propagate.
            yield AgentError(turn=turn, title=e.title, message=f"The prophet could not draft ({e.message}); "
                             "continuing without it.", fatal=False)
            empty = np.zeros(0)
            d = Draft(mode, query, (), empty, "", 0.0)
            return Verification(d, 0, empty, empty, empty, np.zeros(0, dtype=np.int64), "", 0.0)
        yield DraftProposed(turn=turn, mode=mode, text=d.text, tokens=d.tokens, seconds=d.seconds)
        v = self.verify(session, d)
        self.stats.add(v)
        yield DraftVerified(
            turn=turn, mode=mode, accepted=v.accepted, drafted=len(d.tokens), accepted_text=v.accepted_text,
            scores=tuple(float(x) for x in v.scores), seconds=v.seconds,
        )
        return v
