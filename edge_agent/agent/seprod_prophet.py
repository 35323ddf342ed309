"""SeProD's prophet side: the drafts it is asked for, run one at a time on its one worker thread.

Knows: a draft job and its progress (``DraftJob``: submitted, started, tokens so far, the expected wait
from measured costs), preparing drafts when the current image changes and fitting them to the time before
their hook (``seprod_policy.Fitter``), the prophet's prompt (ChatML: only the current image and the mode's
query, the prophet's session kept after the image for the next query on it), cutting a draft at its
markers, and measuring what drafting costs (``seprod_policy.Costs``). ``seprod.Drafter`` inherits it and
adds verification and the loop's hooks. Does not know: the agent's session or verification, the loop,
llama.cpp (the prophet is a ``runtime.types.DraftModelLike``), grammars, the UI.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from edge_agent.agent.seprod_math import (
    ANSWERING,
    DRAFT_MODES,
    GROUNDING,
    Draft,
    answering_query,
    draft_image_key,
    grounding_query,
)
from edge_agent.agent.seprod_policy import Adaptive, Costs, Fitter, Plan, ema
from edge_agent.core.errors import Cancelled, ConfigError
from edge_agent.runtime.types import Checkpoint, DraftModelLike, SessionLike


class DraftJob:
    """A draft submitted to the worker, and its progress (written by the worker, read by the caller)."""

    def __init__(self, mode: str, query: str, image: bytes | None, plan: Plan) -> None:
        self.mode, self.query, self.image, self.plan = mode, query, image, plan
        self.key = (mode, query, draft_image_key(image))
        self.cancel = threading.Event()
        self.future: Future[Draft] = Future()
        self.submitted = time.perf_counter()
        self.prepared = False  # submitted by Drafter.start (ahead of its hook)
        self.started: float | None = None
        self.new_image = False
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.n_tokens = 0
        self.tokens: list[int] = []  # drafted so far (appended by the worker; read a copy)

    def on_token(self, piece: str, token: int) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.tokens.append(token)
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
        prefill = (costs.prefill_new_image if self.new_image or self.started is None
                   else costs.prefill_same_image)
        if prefill is None:
            return None
        since = now - self.started if self.started is not None else 0.0
        return max(0.0, prefill - since) + left


class ProphetDrafts:
    """The prophet's side of :class:`~edge_agent.agent.seprod.Drafter` (which sets these in its
    ``__init__``): its jobs, its worker, its session."""

    prophet: DraftModelLike
    background: bool
    _block: bool | None
    cut: tuple[str, ...]
    answer_cut: tuple[str, ...]
    _evaluated_before: int
    costs: Costs
    adaptive: Adaptive
    fitter: Fitter
    _warm: bool
    _pool: ThreadPoolExecutor
    _lock: threading.Lock
    _pending: dict[tuple[str, str, str], DraftJob]
    _session: SessionLike | None
    _prefilled_image: str | None
    _after_image: Checkpoint | None

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
        if self._block is not None:
            return self._block
        return not self.background or not self.adaptive.enabled


    def _drop(self, which) -> None:
        with self._lock:
            for k in [k for k, job in self._pending.items() if which(job)]:
                self._cancel(self._pending.pop(k))

    @staticmethod
    def _cancel(job: DraftJob) -> None:
        job.cancel.set()  # a running draft stops at its next token; a queued one never starts

    # ---- drafting (prophet side) --------------------------------------------------------------
    def start(self, *, image: bytes | None, question: str, target: str | None = None) -> None:
        """Prepare drafts for a new current image in the background (no-op when not background).

        ``target`` given (after a zoom): the grounding draft first, then the answering draft. A mode the
        adaptive rule has switched off is not drafted.
        """
        if not self.background:
            return
        key = draft_image_key(image)
        self._drop(lambda job: job.key[2] != key)  # drafts for an earlier image are never asked for again
        ahead = [0.0]  # expected prophet seconds of the drafts queued before this one
        new_image = [key != self._prefilled_image and image is not None]
        if target is not None:
            self._submit(GROUNDING, grounding_query(target), image, ahead=ahead, new_image=new_image)
        self._submit(ANSWERING, answering_query(question), image, ahead=ahead, new_image=new_image)

    def draft(self, mode: str, query: str, image: bytes | None) -> Draft:
        """The prophet's greedy draft of up to L_d tokens for (image, query); blocks until ready."""
        if mode not in DRAFT_MODES:
            raise ValueError(f"mode must be one of {DRAFT_MODES}")
        t0 = time.perf_counter()
        job = self._take(mode, query, image) or self._submit(mode, query, image, plan=Plan(True,
                                                                                           self.draft_len),
                                                                                           keep=False)
        d = job.future.result()
        return dataclasses.replace(d, waited=time.perf_counter() - t0)

    def _take(self, mode: str, query: str, image: bytes | None) -> DraftJob | None:
        with self._lock:
            return self._pending.pop((mode, query, draft_image_key(image)), None)

    def _submit(self, mode: str, query: str, image: bytes | None, *, plan: Plan | None = None,
                keep: bool = True, ahead: list[float] | None = None,
                new_image: list[bool] | None = None) -> DraftJob:
        """Queue a draft (``keep``: remembered for the hook; ``ahead``/``new_image``: prepared by
        :meth:`start`, fitted to the time before its hook). A plan that does not draft queues nothing."""
        key = (mode, query, draft_image_key(image))
        with self._lock:
            if keep and key in self._pending:
                return self._pending[key]
            plan = plan or self.adaptive.plan(mode, self.costs)
            if ahead is not None and new_image is not None:
                plan = self._fit(mode, plan, ahead, new_image)
            job = DraftJob(mode, query, image, plan)
            job.prepared = ahead is not None
            if keep:
                self._pending[key] = job
            if plan.use:
                self._pool.submit(self._run, job)
            return job

    def _fit(self, mode: str, plan: Plan, ahead: list[float], new_image: list[bool]) -> Plan:
        """A prepared draft fitted to the time before its hook
        (:class:`~edge_agent.agent.seprod_policy.Fitter`). Updates ``ahead`` (the worker runs one draft at a
        time) and ``new_image`` (only the first reads it)."""
        if not plan.use or self.block or not self.adaptive.enabled:
            return plan
        plan, queued = self.fitter.fit(mode, plan, self.costs, self.adaptive.acceptance(mode), ahead=ahead[0],
                                       new_image=new_image[0])
        if queued is not None:
            ahead[0] += queued
            new_image[0] = False
        return plan

    # ---- what is prepared (the hooks take it; tests look at it) --------------------------------
    def prepared(self) -> dict[tuple[str, str, str], Plan]:
        """The drafts prepared and not taken yet: {(mode, query, draft_image_key(image)): plan}."""
        with self._lock:
            return {k: job.plan for k, job in self._pending.items()}

    def wait_idle(self, timeout: float) -> None:
        """Wait until the prophet's worker has ended every draft given to it so far (cancelled ones too)."""
        self._pool.submit(lambda: None).result(timeout=timeout)

    def _run(self, job: DraftJob) -> None:
        """Worker thread: run one job, its result or error into its future."""
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            if job.cancel.is_set():
                raise Cancelled()
            job.future.set_result(self._draft_now(job))
        except BaseException as e:  # handed to whoever waits on the future
            job.future.set_exception(e)

    def _draft_now(self, job: DraftJob) -> Draft:
        """Worker thread only. Prompt:
        ``<|im_start|>user\\n[image]query<|im_end|>\\n<|im_start|>assistant\\n``."""
        t0 = job.started = time.perf_counter()
        mode, query, image = job.mode, job.query, job.image
        key = job.key[2]
        s = self._session
        if s is None or key != self._prefilled_image or self._after_image is None:
            job.new_image = image is not None
            if s is not None:
                self._evaluated_before += s.n_evaluated
            self._session = None  # until the image is in: a failure here leaves no half-built session
            s = self.prophet.session()  # clears the prophet's KV cache
            s.append_text("<|im_start|>user\n", special=True)
            if image is not None:
                s.append_image(image)
            self._session, self._prefilled_image, self._after_image = s, key, s.checkpoint()
        else:
            s.rollback(self._after_image)  # same image: its chunks stay in the cache
        s.append_text(query, special=False)  # the user's text never becomes control tokens
        s.append_text("<|im_end|>\n<|im_start|>assistant\n", special=True)
        gen = s.generate(max_tokens=job.plan.draft_len, temperature=0.0, on_token=job.on_token,
                         cancel=job.cancel)
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
        # a draft is text: it ends before a control token (<|fim_middle|> from a confused prophet would
        # enter the agent's context while the draft's text, where it renders empty, says nothing of it)
        n = next((i for i, t in enumerate(tokens) if self._is_control(t)), len(tokens))
        tokens, logprobs = tokens[:n], logprobs[:n]
        n = self._cut_length(tokens, self.answer_cut if mode == ANSWERING else self.cut)
        if mode == ANSWERING and self._text(tokens[:n]).lstrip().startswith("{"):
            n = 0  # the answer's grammar never begins an answer with "{": a draft the agent could not write
        tokens, logprobs = tokens[:n], logprobs[:n]
        text = self._text(tokens)
        return Draft(mode, query, tuple(tokens), np.asarray(logprobs, dtype=np.float64), text,
                     time.perf_counter() - t0, draft_len=job.plan.draft_len)

    def _measure(self, job: DraftJob, *, cancelled: bool = False) -> None:
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
                c.prefill_new_image = ema(c.prefill_new_image, prefill)
            else:
                c.prefill_same_image = ema(c.prefill_same_image, prefill)
        if job.n_tokens > 1 and job.first_token is not None and job.last_token is not None:
            c.prophet_token = ema(c.prophet_token, (job.last_token - job.first_token) / (job.n_tokens - 1))

    def _text(self, tokens: Sequence[int], *, special: bool = False) -> str:
        if not tokens:
            return ""
        return self.prophet.detokenize(list(tokens), special=special)

    def _is_control(self, token: int) -> bool:
        """A control token: it renders only as special text (``<|im_end|>``, ``<|fim_middle|>``)."""
        return not self._text([token]) and bool(self._text([token], special=True))

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
