"""Generation in a session: sampling tokens one by one under stop strings, a GBNF grammar and
cancellation, and forced text evaluated in one verified batch.

Knows: the token loop of :meth:`Generating.generate` and its steps, on the state a
:class:`~edge_agent.runtime.session.Session` keeps (``history``, the pending tokens, ``n_pos``,
``n_cells``, the next-token logits). Does not know chat formats, prompts or tools. ``Session`` inherits
this class; it is not used alone (what it needs of the session is declared below and provided there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from edge_agent.core.errors import Cancelled, ModelRuntimeError
from edge_agent.runtime import forced
from edge_agent.runtime.handle import Handle
from edge_agent.runtime.sampling import Run, Sampler
from edge_agent.runtime.scoring import row_logsumexp
from edge_agent.runtime.textstream import StopStream
from edge_agent.runtime.tokenizer import Tokenizer
from edge_agent.runtime.types import Generation, TokenCallback, UntilFn


class Generating:
    """``generate`` for :class:`~edge_agent.runtime.session.Session` (its state, its evaluation)."""

    forced_batches = True  # generate(): forced text in one verified batch (False: token by token)
    # ... until a draft is refused at its first token: then token by token for the rest of that generate
    # (a model that does not write forced text as its tokenizer does, random weights: each refused batch
    # of 2-5 tokens costs 1.7-2.7 one-token decodes on 2 cores; False: drafts after every refusal)
    forced_stop_when_refused = True

    # the session's state and steps that generation reads and updates (runtime.session.Session)
    _h: Handle
    _tok: Tokenizer
    history: list[int]
    _pending: list[int]
    n_pos: int
    n_cells: int
    n_evaluated: int
    _logits: np.ndarray | None
    _scratch: np.ndarray | None

    def _check(self) -> None:
        raise NotImplementedError

    def _drop_kept(self) -> None:
        raise NotImplementedError

    def _flush(self) -> int:
        raise NotImplementedError

    def _free_cells(self, need: int = 0) -> int:
        raise NotImplementedError

    def generate(
        self,
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        seed: int = 0,
        grammar: str | None = None,
        on_token: TokenCallback | None = None,
        cancel: threading.Event | None = None,
        until: UntilFn | None = None,
    ) -> Generation:
        """Sample up to ``max_tokens`` tokens and append them to the conversation.

        - ``temperature`` 0: greedy; else softmax(logits / T) sampled with numpy's ``default_rng(seed)``.
        - ``grammar``: GBNF text with a ``root`` rule; a bad grammar raises ModelRuntimeError. Every
          token is checked against it (the fast path checks only the drawn token).
        - ``stop``: strings; generation ends when the text contains one. ``Generation.text`` is cut
          before it, but the tokens that produced it stay in the session (KV + history), as does an
          end-of-generation token: the session holds exactly ``Generation.tokens``. Roll back with a
          checkpoint to drop them.
        - ``on_token(piece, token_id)``: once per sampled token with the text that became final (may be
          '', text that could start a stop string is held back); after a cancel, held-back text comes
          in one last call with token id -1. The pieces concatenate to ``Generation.text``.
        - ``cancel``: checked before each token and after each callback, and it aborts a running
          decode (through the model's abort flag); stop_reason "cancelled".
        - Under a grammar, forced text (``], "label": "``) is evaluated in one batch and verified: only
          tokens decoding would sample are kept (``runtime.forced``; ``forced_batches = False``: not).
        The last sampled token is left pending (not decoded) until the session needs it.
        ``Generation.logprobs``: log p of each token under the model (before grammar and temperature).
        - ``until(tokens, logprobs)``: asked after each sampled token (with every token and log p so far);
          True ends the generation there, stop_reason "until" (the tokens stay, as after a stop string).
        """
        with self._h.lock, self._h.cancellable(cancel, raise_if_set=False):  # a set cancel -> "cancelled"
            self._check()
            self._drop_kept()
            t0, ev0 = time.perf_counter(), self.n_evaluated
            run = Run(StopStream(stop), on_token)
            with Sampler(self._h, grammar=grammar, temperature=temperature, seed=seed) as sampler:
                n = self._start_generation(max_tokens, run)
                probe = forced.probe_of(self._tok) if grammar is not None and self.forced_batches else None
                i = 0
                while i < n:
                    if self._stops_before(i, run, cancel):
                        break
                    self._sample_next(run, sampler, last=i == n - 1)
                    i += 1
                    if run.reason == "length" and probe is not None and i < n and not (
                        cancel and cancel.is_set()):
                        took, refused = self._jump(run, sampler, probe, n - i, cancel)
                        i += took
                        if refused and self.forced_stop_when_refused:
                            probe = None
                    if run.reason in ("eos", "stop", "cancelled"):
                        break
                    if until is not None and i < n and until(run.tokens, run.lps):
                        run.reason = "until"
                        break
                    if cancel is not None and cancel.is_set():
                        run.reason = "cancelled"
                        break
                if run.reason == "cancelled":
                    run.release_held()
            return Generation(text=run.stream.text, tokens=run.tokens, stop_reason=run.reason,
                              logprobs=run.lps,
                              n_eval=self.n_evaluated - ev0, seconds=time.perf_counter() - t0)

    def _start_generation(self, max_tokens: int, run: Run) -> int:
        """Evaluate what is pending before the first token; returns how many tokens may be sampled."""
        if max_tokens <= 0:
            return 0
        try:
            self._flush()
        except Cancelled:
            run.reason = "cancelled"
            return 0
        if self._logits is None:
            raise ModelRuntimeError("Generation needs a context: append text first.")
        return max_tokens

    def _stops_before(self, i: int, run: Run, cancel: threading.Event | None) -> bool:
        """Before token ``i``: a set cancel, a full context, or a cancelled decode of the previous token
        (it stays pending) ends the generation (``run.reason`` says why)."""
        if cancel is not None and cancel.is_set():
            run.reason = "cancelled"
            return True
        if i > 0:
            if self._free_cells(1) < 1:
                run.reason = "length"
                return True
            try:
                self._flush()
            except Cancelled:  # the abort flag stopped this token's decode; it stays pending
                run.reason = "cancelled"
                return True
        return False

    def _jump(self, run: Run, sampler: Sampler, probe: forced.Probe, budget: int,
              cancel: threading.Event | None) -> tuple[int, bool]:
        """The text the grammar forces after the pending token, verified in one batch: tokens sampled (0:
        none), and whether the draft was refused at its first token (none of it kept)."""
        assert len(self._pending) == 1
        got = forced.jump(self._h, sampler, run, self._tok, probe, self._pending[0], self.n_pos - 1,
                          room=self._free_cells() - 1, budget=budget, scratch=self._scratch_for(),
                          cancel=cancel)
        if got is not None:
            self.n_evaluated += got.n_eval
            self._took(got.tokens, got.n_kv, got.logits)
            return len(got.tokens), got.n_kv == 1
        return 0, False

    def _took(self, tokens: list[int], n_kv: int, logits: np.ndarray | None) -> None:
        """``tokens`` join the history, ``n_kv`` cells seq 0; with ``logits`` nothing is pending, else the
        last token."""
        self.history.extend(tokens)
        self.n_pos += len(tokens)
        self.n_cells += n_kv
        self._pending = [] if logits is not None else [tokens[-1]]
        self._logits = logits

    def _sample_next(self, run: Run, sampler: Sampler, *, last: bool) -> None:
        """Sample one token from the current logits, append it (pending), stream its text."""
        logits = self._logits
        assert logits is not None
        tok = sampler.sample(logits)
        sampler.accept(tok)
        lse = row_logsumexp(logits[None, :], self._scratch_for())[0]
        self.history.append(tok)
        self._pending.append(tok)
        self.n_pos += 1
        self._logits = None
        run.add(tok, float(logits[tok]) - float(lse),
                None if self._tok.is_eog(tok) else self._tok.token_bytes(tok),
                last=last)

    def _scratch_for(self) -> np.ndarray:
        if self._scratch is None:
            self._scratch = np.empty((8, self._tok.n_vocab), dtype=np.float32)
        return self._scratch
