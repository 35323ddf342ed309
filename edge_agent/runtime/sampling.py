"""Choosing the next token: greedy or seeded temperature sampling, under an optional GBNF grammar.

Knows: llama.cpp's grammar sampler (init, apply to a token-data array, accept, free), how to draw
from a logits row with numpy, and what one generate call produced so far (:class:`Run`: tokens,
log-probs, the text streamed through ``textstream.StopStream``, why it ended). Does not know sessions,
the KV cache or what the tokens mean: ``Session.generate`` feeds it one logits row per step. Reaches llama.cpp
through the :class:`~edge_agent.runtime.handle.Handle` (its vocabulary pointer and token-data buffer).

Cost: the fast path checks only the drawn token against the grammar (one-entry array); only a
rejected draw pays for masking the whole vocabulary (~V entries through llama.cpp's grammar).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from edge_agent.core.errors import ModelRuntimeError
from edge_agent.runtime._lib import C, captured_stderr, clear_errors, recent_errors
from edge_agent.runtime.handle import TOKEN_DATA, Handle
from edge_agent.runtime.textstream import StopStream
from edge_agent.runtime.types import TokenCallback


def draw(logits: np.ndarray, temperature: float, rng: np.random.Generator | None) -> int:
    """Argmax when ``temperature`` <= 0 (or no rng), else one draw from softmax(logits / T)."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    cdf = np.cumsum(np.exp(z))
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


TOP_K = 64  # greedy under a grammar: candidates checked first ...
WINDOWS = (TOP_K, 2048, 32768)  # ... then more, before masking the whole vocabulary
REDRAWS = 8  # sampling under a grammar: draws tried before masking the whole vocabulary


class Sampler:
    """The sampling state of one ``generate`` call. Use as a context manager (frees the grammar)."""

    def __init__(self, handle: Handle, *, grammar: str | None, temperature: float, seed: int) -> None:
        self._h = handle
        self.temperature = temperature
        self.rng = np.random.default_rng(seed) if temperature > 0 else None
        self.gram = None
        if grammar is not None:
            clear_errors()
            with captured_stderr() as printed:
                self.gram = C.llama_sampler_init_grammar(handle.vocab, grammar.encode("utf-8"), b"root")
            if not self.gram:
                detail = " ".join(printed[0].split()) or recent_errors() or "parse error"
                raise ModelRuntimeError(f"The grammar is not valid GBNF: {detail[:400]}", title="Bad grammar")

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.gram is not None:
            C.llama_sampler_free(self.gram)
            self.gram = None

    def sample(self, logits: np.ndarray) -> int:
        """The next token: drawn from ``logits``, then (if a grammar rejects it) from the masked row.

        Exact: redrawing from the masked, renormalised distribution is what sampling under the grammar
        means; a greedy draw the grammar allows is the masked argmax.
        """
        tok = draw(logits, self.temperature, self.rng)
        if self.gram is None or self._allows(tok):
            return tok
        if self.temperature <= 0 or self.rng is None:
            best = self._best_allowed(logits)
            if best is not None:
                return best
        else:  # rejection: a redraw the grammar allows is a draw from the masked distribution (exact)
            for _ in range(REDRAWS):
                tok = draw(logits, self.temperature, self.rng)
                if self._allows(tok):
                    return tok
        return draw(self._mask(logits), self.temperature, self.rng)

    def _best_allowed(self, logits: np.ndarray) -> int | None:
        """Greedy under the grammar from the highest logits only, in growing windows (``WINDOWS``): the best
        allowed one of a window is the masked argmax when its logit is above every logit outside it; None
        when no window shows it (then the whole row is masked).

        Why: masking the whole row runs the grammar over every token of the vocabulary, 17-30 ms at
        Qwen's 151,936 (the 2B stand-in, tail_grammar("zoom")), against 0.1 ms for 64 candidates; at
        ~80 ms per decoded token on a 2-core laptop that is a 20-40% slower step each time the model's
        favourite token does not fit the grammar (a digit where a bbox needs one, a quote ...). A model
        that puts the few allowed tokens far down (random weights: a coordinate's dozen digit tokens at
        rank ~10,000 of 151,936) is served by the larger windows at a fraction of the full mask."""
        for k in WINDOWS:
            if k >= len(logits):
                return None
            part = np.argpartition(-logits, k)
            idx = part[:k]
            data = np.zeros(k, dtype=TOKEN_DATA)
            data["id"] = idx
            data["logit"] = logits[idx]
            self._apply(data)
            ok = np.isfinite(data["logit"])
            if not ok.any():
                continue
            vals = logits[idx]
            best = vals[ok].max()
            if not best > logits[part[k]]:  # a tie with a token left out: be exact
                return None
            return int(idx[ok][vals[ok] == best].min())  # the lowest id among equal best logits, as argmax
        return None

    def forced_text(self, ids: np.ndarray, chars: str, max_chars: int) -> str:
        """The text the grammar forces next, as far as one probe character at a time shows it: while
        exactly one of the probe tokens ``ids`` (single-character tokens of ``chars``) is allowed, that
        character is forced. Leaves this sampler's grammar as it is (a clone is advanced). A guess for
        a draft, never trusted: the caller verifies every token against the model."""
        if self.gram is None or not len(ids):
            return ""
        clone = C.llama_sampler_clone(self.gram)
        out: list[str] = []
        try:
            data = np.zeros(len(ids), dtype=TOKEN_DATA)
            while len(out) < max_chars:
                data["id"] = ids
                data["logit"] = 0.0
                arr = C.llama_token_data_array(data=data.ctypes.data_as(C.llama_token_data_p), size=len(data),
                                               selected=-1, sorted=False)
                C.llama_sampler_apply(clone, ctypes.byref(arr))
                ok = np.flatnonzero(np.isfinite(data["logit"]))
                if len(ok) != 1:
                    break
                out.append(chars[int(ok[0])])
                C.llama_sampler_accept(clone, int(ids[int(ok[0])]))
        finally:
            C.llama_sampler_free(clone)
        return "".join(out)

    def accept(self, token: int) -> None:
        """Advance the grammar past ``token`` (call once per appended token)."""
        if self.gram is not None:
            C.llama_sampler_accept(self.gram, token)

    def _apply(self, data: np.ndarray) -> None:
        arr = C.llama_token_data_array(
            data=data.ctypes.data_as(C.llama_token_data_p), size=len(data), selected=-1, sorted=False
        )
        C.llama_sampler_apply(self.gram, ctypes.byref(arr))

    def _allows(self, token: int) -> bool:
        one = np.zeros(1, dtype=TOKEN_DATA)
        one["id"] = token
        self._apply(one)
        return bool(np.isfinite(one["logit"][0]))

    def _mask(self, logits: np.ndarray) -> np.ndarray:
        data = self._h.token_data()
        data["logit"] = logits
        self._apply(data)
        masked = data["logit"].copy()
        if not np.isfinite(masked).any():
            raise ModelRuntimeError("The grammar allows no next token here (it cannot be completed with this "
                                    "vocabulary).")
        return masked


@dataclass
class Run:
    """One ``generate`` call's output so far; ``reason``: length (default), eos, stop, cancelled, until."""

    stream: StopStream
    on_token: TokenCallback | None
    tokens: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    reason: str = "length"

    def add(self, token: int, logprob: float, piece: bytes | None, *, last: bool) -> None:
        """Record a sampled token and stream its text (``piece`` None: an end-of-generation token, which
        releases held-back text; ``last``: the final token allowed, which does too)."""
        self.tokens.append(token)
        self.lps.append(logprob)
        if piece is None:
            self.reason = "eos"
            text = self.stream.flush()
        else:
            text = self.stream.feed(piece)
            if self.stream.stopped:
                self.reason = "stop"
            elif last:
                text += self.stream.flush()
        if self.on_token is not None:
            self.on_token(text, token)

    def release_held(self) -> None:
        """After a cancel: held-back text in one last callback with token id -1."""
        rest = self.stream.flush()
        if rest and self.on_token is not None:
            self.on_token(rest, -1)
