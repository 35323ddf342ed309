"""Choosing the next token: greedy or seeded temperature sampling, under an optional GBNF grammar.

Knows: llama.cpp's grammar sampler (init, apply to a token-data array, accept, free) and how to draw
from a logits row with numpy. Does not know sessions, the KV cache, stop strings or what the tokens
mean: ``Session.generate`` feeds it one logits row per step.

Cost: the fast path checks only the drawn token against the grammar (one-entry array); only a
rejected draw pays for masking the whole vocabulary (~V entries through llama.cpp's grammar).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.errors import ModelRuntimeError
from edge_agent.runtime._lib import C, captured_stderr, clear_errors, recent_errors

if TYPE_CHECKING:
    from edge_agent.runtime.model import Model

# llama_token_data {int32 id; float logit; float p} as a numpy record (12 bytes, no padding).
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def draw(logits: np.ndarray, temperature: float, rng: np.random.Generator | None) -> int:
    """Argmax when ``temperature`` <= 0 (or no rng), else one draw from softmax(logits / T)."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    cdf = np.cumsum(np.exp(z))
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


class Sampler:
    """The sampling state of one ``generate`` call. Use as a context manager (frees the grammar)."""

    def __init__(self, model: Model, *, grammar: str | None, temperature: float, seed: int) -> None:
        self.model = model
        self.temperature = temperature
        self.rng = np.random.default_rng(seed) if temperature > 0 else None
        self.gram = None
        if grammar is not None:
            clear_errors()
            with captured_stderr() as printed:
                self.gram = C.llama_sampler_init_grammar(model._vocab, grammar.encode("utf-8"), b"root")
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
        return draw(self._mask(logits), self.temperature, self.rng)

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
        data = self.model.token_data()
        data["logit"] = logits
        self._apply(data)
        masked = data["logit"].copy()
        if not np.isfinite(masked).any():
            raise ModelRuntimeError("The grammar allows no next token here (it cannot be completed with this vocabulary).")
        return masked
