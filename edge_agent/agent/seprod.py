"""SeProD (self-prophetic decoding): a base "prophet" model drafts tokens, the agent verifies them.

What it knows (the pure parts live in ``seprod_math``: acceptance maths, values, the prophet's
queries; ``seprod_policy``: costs and the adaptive rule; import them from there; the prophet's side,
its draft jobs on one worker thread, is ``seprod_prophet.ProphetDrafts``, which ``Drafter`` inherits):
- what the prophet is shown: ONLY the current image (the latest crop, or the original; none for
  text-only models) and a mode query, in the shared ChatML format. The query is the user's question
  (answering) or a yes/no question about a target (grounding). The target is the zoom ``label`` the
  agent wrote (as in the paper, the search model decides what to look for): that label is the ONLY
  agent text the prophet ever sees, and it is treated as untrusted model output
  (:func:`seprod_math.clean_label`: printable, at most ``LABEL_MAX_CHARS``, dropped when empty or
  garbage; tokenized with special tokens not parsed). Never the agent's reasoning or history;
- how a draft is verified: one batched teacher-forced ``score`` call on the agent's session
  (log p_s and ranks of every draft token in one decode), then the accepted prefix is put into the
  agent's KV cache exactly as if the agent had generated it (adopted from the scoring pass, no
  decode); the agent then continues from its own distribution. "Exactly": same
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
- the grounding verdict (yes/no first, :func:`seprod_math.parse_verdict`; an accepted "no" adds
  :data:`seprod_math.STEER_ELSEWHERE`);
- its events: DraftProposed, DraftVerified, DraftSkipped, AnswerToken(from_prophet), AgentError (no draft).

What it does not know: llama.cpp (it talks to ``runtime.types.DraftModelLike`` / ``SessionLike``), where in
the agent's turn a draft goes (the loop decides: a grounding draft opens the think block after a
zoom, an answering draft is the start of the answer), grammars, the UI, thread counts (the engine
picks them; :func:`seprod_policy.shared_threads` is its rule; ``runtime.cores`` keeps the two
models' threads within the cores while they compute). The prophet model is used from one worker
thread only (so drafts can be prepared while the agent works; see ``Drafter.start``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from edge_agent.agent.events import AgentError, AnswerToken, DraftProposed, DraftSkipped, DraftVerified, Event
from edge_agent.agent.seprod_math import (
    ANSWER_CUT,
    ANSWERING,
    DEFAULT_CUT,
    DEFAULT_GAMMA,
    DEFAULT_TAU,
    GROUNDING,
    STEER_ELSEWHERE,
    Draft,
    SeProDStats,
    Verification,
    accepted_length,
    answering_query,
    combined_scores,
    grounding_query,
    parse_verdict,
    search_weight,
)
from edge_agent.agent.seprod_policy import Adaptive, Costs, Fitter, ema
from edge_agent.agent.seprod_prophet import DraftJob, ProphetDrafts
from edge_agent.core.errors import ConfigError, EdgeAgentError
from edge_agent.runtime.types import Checkpoint, DraftModelLike, SessionLike


class Drafter(ProphetDrafts):
    """Drafts with the prophet model and verifies drafts on the agent's session.

    ``prophet``: a loaded DraftModelLike sharing the agent's tokenizer (checked by whoever loads it).
    ``agent_vocab``: V of the agent's logits (for normalising ranks).
    ``draft_len`` (L_d), ``tau``, ``a0``: the SeProD settings; ``gamma``: see :func:`search_weight`.
    ``adaptive``: per-mode acceptance switches modes off and shortens L_d (:class:`Adaptive`); False
    pins L_d and tau and waits for every draft (experiments: each question gets its drafts whatever
    the timing, so acceptance and answers do not depend on how busy the machine is).
    ``background``: run the prophet in a worker thread so :meth:`start` can prepare drafts while the
    agent works (writes its action, waits for a tool). With ``False`` the work still happens in that one
    thread (the prophet model is only ever touched by it) but callers only submit and wait.
    ``block``: at a hook, wait for a draft that is not ready whatever it costs (default: when not
    ``background``, or not ``adaptive``); else wait only while the expected saving exceeds the
    expected wait, and fit prepared drafts to the time before their hook (:meth:`_fit`).
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
        prophet: DraftModelLike,
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
            raise ConfigError("Setting seprod_tau must be between 0 and 1 (s_j is a probability), not "
                              f"{tau}.")
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
        self.fitter = Fitter()  # prepared drafts fitted to the time before their hook; the probe back-off
        self._warm = False  # the prophet has drafted once (its first draft is not measured)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prophet")
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], DraftJob] = {}
        # prophet-side cache (worker thread only): the session, and a checkpoint after the image
        self._session: SessionLike | None = None
        self._prefilled_image: str | None = None
        self._after_image: Checkpoint | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        self._drop(lambda job: True)
        self._pool.shutdown(wait=True)

    def retune(self, *, tau: float, draft_len: int) -> None:
        self.tau, self.draft_len = tau, draft_len

    @property
    def tokens_evaluated(self) -> int:
        """Prompt tokens the prophet has evaluated so far (its images in embeddings), all questions."""
        s = self._session
        return self._evaluated_before + (s.n_evaluated if s is not None else 0)

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
        self.costs.verify_token = ema(self.costs.verify_token, seconds / len(cand))
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
            self.costs.agent_token = ema(self.costs.agent_token, seconds / tokens)

    # ---- hooks for the loop (generators of events) --------------------------------------------
    def ground(
        self, session: SessionLike, *, turn: int, image: bytes | None, target: str
    ) -> Generator[Event, None, Verification]:
        """Grounding round after a zoom: call right after the think block opens. ``target``: the zoom
        label the agent wrote (or the question), cleaned by :func:`seprod_math.clean_label`. The returned
        value carries the prophet's verdict; after an accepted "no", ``steer`` is text for the loop to
        append."""
        return (yield from self._round(session, turn=turn, mode=GROUNDING, query=grounding_query(target),
                                       image=image))

    def answer(
        self, session: SessionLike, *, turn: int, image: bytes | None, question: str,
        max_tokens: int | None = None, written: Sequence[int] = (), done: bool = False,
    ) -> Generator[Event, None, Verification]:
        """Answering round: call where the agent's answer continues; yields the accepted text as an
        ``AnswerToken(from_prophet=True)``; the loop then continues generating the answer.
        ``max_tokens``: what is left of the answer's token budget (lead + accepted tokens never exceed it).
        ``written``: the answer's tokens already in the session, the agent's own (SSR's answer check
        decodes the answer's start before the answer stays): the draft, which starts where the answer
        starts, is verified after them when it begins with them, else it is of no use here (skipped,
        "diverged"; the adaptive rule counts it as a draft of which nothing was accepted). ``done``:
        those tokens hold the whole answer; nothing is drafted or waited for (skipped, "answered")."""
        query = answering_query(question)
        if done:
            job = self._take(ANSWERING, query, image)
            if job is not None:
                self._cancel(job)  # the prophet stops drafting what nobody needs
            self.stats.skip("answered", 0.0)
            yield DraftSkipped(turn=turn, mode=ANSWERING, reason="answered",
                               detail="the answer check's tokens hold the whole answer")
            return Verification.empty(ANSWERING, query, skipped="answered")
        v = yield from self._round(session, turn=turn, mode=ANSWERING, query=query, image=image,
                                   max_tokens=max_tokens, written=tuple(written))
        if v.accepted_text:
            yield AnswerToken(turn=turn, text=v.accepted_text, from_prophet=True)
        return v

    def _round(
        self, session: SessionLike, *, turn: int, mode: str, query: str, image: bytes | None,
        max_tokens: int | None = None, written: tuple[int, ...] = (),
    ) -> Generator[Event, None, Verification]:
        job = self._take(mode, query, image)
        if job is None:  # not prepared by start(): plan now, draft now
            job = self._submit(mode, query, image, keep=False)
        elif job.prepared:  # how long the agent worked between preparing the draft and needing it
            self.costs.lead[mode] = ema(self.costs.lead.get(mode), time.perf_counter() - job.submitted)
        if not job.plan.use:
            reason = job.plan.reason
            if reason == "low_acceptance":
                self.adaptive.skipped(mode)
            self.stats.skip(reason, 0.0)
            yield DraftSkipped(turn=turn, mode=mode, reason=reason, detail=job.plan.note)
            return Verification.empty(mode, query, skipped=reason)
        t0 = time.perf_counter()
        ready = job.future.done()
        if written and not ready:
            so_far = tuple(job.tokens[:len(written)])  # what the prophet has drafted so far
            if so_far != written[:len(so_far)]:  # it already begins otherwise: no need to wait
                self._cancel(job)
                return (yield from self._diverged(turn, mode, query, written, len(job.tokens), 0.0))
        if not ready and not self.block:
            reason = self._wait(job, len(written))
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
        note = job.plan.note
        diverged = bool(written) and d.tokens[:len(written)] != written
        if written and not diverged:
            # the agent wrote the draft's first tokens itself: what is left of the draft continues them
            n = len(written)
            d = dataclasses.replace(d, tokens=d.tokens[n:], logprobs=d.logprobs[n:],
                                    text=self._text(d.tokens[n:]))
            note = "; ".join(x for x in (note, f"after its first {n} tokens, which the agent wrote") if x)
        yield DraftProposed(turn=turn, mode=mode, text=d.text, tokens=d.tokens, seconds=d.seconds,
                            waited=d.waited,
                            draft_len=d.draft_len, note=note)
        if diverged:  # the agent's own start already says otherwise: nothing of the draft can follow it
            return (yield from self._diverged(turn, mode, query, written, len(d.tokens), d.waited))
        v = self.verify(session, d, max_tokens=max_tokens)
        if mode == GROUNDING:
            v.verdict, end = parse_verdict(v.draft.text)
            v.verdict_accepted = bool(v.verdict) and len(v.accepted_text) >= end
            if v.verdict == "no" and v.verdict_accepted:
                v.steer = STEER_ELSEWHERE
        self.stats.add(v)
        self.adaptive.record(mode, len(v.draft.tokens), v.accepted)
        if v.accepted:  # a draft that was ready and accepted: probe at the normal rate again
            self.fitter.accepted(mode)
        yield DraftVerified(
            turn=turn, mode=mode, accepted=v.accepted, drafted=len(v.draft.tokens),
            accepted_text=v.accepted_text,
            scores=tuple(float(x) for x in v.scores), seconds=v.seconds, lead=len(v.lead), verdict=v.verdict,
            verdict_accepted=v.verdict_accepted,
        )
        return v

    def _diverged(self, turn: int, mode: str, query: str, written: tuple[int, ...], drafted: int,
                  waited: float) -> Generator[Event, None, Verification]:
        """A draft that does not begin with the answer's start the agent wrote: none of it can follow
        that start (the adaptive rule counts it as a draft of which nothing was accepted)."""
        self.stats.skip("diverged", waited)
        self.adaptive.record(mode, drafted, 0)
        yield DraftSkipped(turn=turn, mode=mode, reason="diverged", waited=waited,
                           detail=f"the answer already starts {self._text(written)!r}")
        return Verification.empty(mode, query, skipped="diverged", waited=waited)

    def _wait(self, job: DraftJob, written: int = 0) -> str:
        """Wait for a draft that is not ready while that is expected to pay; "" when it is ready, else
        why the agent goes on without it. ``written``: the answer's tokens the agent wrote already (only
        the draft's tokens after them can save anything)."""
        left = max(0, job.plan.draft_len - written)
        saving = self.costs.saving(self.adaptive.acceptance(job.mode), left, job.rate())
        if saving is None:
            return "its saving cannot be priced yet: nothing measured"
        if saving <= 0:
            return f"it would save nothing (expected {saving * 1e3:.0f} ms)"
        remaining = job.expected_remaining(self.costs, time.perf_counter())
        if remaining is not None and remaining > saving:
            return f"expected wait {remaining * 1e3:.0f} ms > expected saving {saving * 1e3:.0f} ms"
        try:
            job.future.exception(timeout=saving)
        except FutureTimeout:
            return f"waited its expected saving, {saving * 1e3:.0f} ms"
        return ""
