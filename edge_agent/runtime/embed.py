"""Sentence vectors from a loaded model: the mean of its last hidden layer over a text's tokens.

Knows: how to open a second llama.cpp context on an already loaded :class:`~edge_agent.runtime.Model`
with ``embeddings=True`` and mean pooling, and how to turn texts into one L2-normalised vector each
(``llama_get_embeddings_seq`` after one decode per text; the KV cache is cleared between texts).
Does not know what the texts are (``edge_agent.library`` clusters rationales with them) or any
chat format: a text is tokenized as plain text, special tokens not parsed.

Why hidden states and not logits: the final-layer hidden state (after the output norm) is the
model's own representation of the text, n_embd floats (576 for SmolLM2-135M, 2048 for Qwen3-VL 2B),
while logits are a vocabulary-sized (49k-152k) distribution over the *next* token only. Mean pooling
over all tokens weighs the whole sentence. Cost: one prefill of the text per vector (a 20-token
rationale on SmolLM2-135M: a few ms on one core). The context is separate from the model's own, so a
session in use is never disturbed; it holds ``n_ctx`` cells (512 by default: texts are cut there).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.core.errors import ModelRuntimeError

if TYPE_CHECKING:
    from edge_agent.runtime.model import Model


class Embedder:
    """Mean-pooled last-layer hidden states of ``model``: ``Embedder(model).embed(texts) -> (n, n_embd)``."""

    def __init__(self, model: Model, *, n_ctx: int = 512) -> None:
        from edge_agent.runtime import _lib

        model.handle.check_open()
        self.model = model
        self._C: Any = _lib.C
        C = self._C
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx  # a pooled sequence must fit one micro-batch
        cp.n_seq_max = 1
        cp.n_threads = model.n_threads
        cp.n_threads_batch = model.n_threads_batch
        cp.embeddings = True
        cp.pooling_type = C.LLAMA_POOLING_TYPE_MEAN
        cp.no_perf = True
        _lib.clear_errors()
        self._ctx = C.llama_init_from_model(model.handle.llama_model, cp)
        if not self._ctx:
            raise ModelRuntimeError(
                f"llama.cpp could not create an embedding context for {model.path.name} "
                f"({_lib.recent_errors() or 'no details'}). Free memory or build the library without "
                "--model.")
        self.n_ctx = int(C.llama_n_ctx(self._ctx))
        self.n_embd = int(C.llama_model_n_embd(model.handle.llama_model))
        self._batch = C.llama_batch_init(self.n_ctx, 0, 1)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), n_embd) float32, each row the mean hidden state of the text, L2-normalised."""
        C = self._C
        if self._ctx is None:
            raise ModelRuntimeError("This embedder was closed.")
        out = np.zeros((len(texts), self.n_embd), dtype=np.float32)
        b = self._batch
        mem = C.llama_get_memory(self._ctx)
        with self.model.handle.lock:  # llama.cpp calls on one model, one thread at a time
            for i, text in enumerate(texts):
                tok = self.model.tokenizer
                toks = tok.tokenize(text, special=False)
                if tok.add_bos and tok.bos >= 0:
                    toks = [tok.bos] + toks
                toks = toks[: self.n_ctx] or [max(tok.bos, 0)]
                for j, t in enumerate(toks):
                    b.token[j] = t
                    b.pos[j] = j
                    b.n_seq_id[j] = 1
                    b.seq_id[j][0] = 0
                    b.logits[j] = 1
                b.n_tokens = len(toks)
                C.llama_memory_clear(mem, True)
                # one OpenMP team per model (cores.ComputeLane)
                rc = self.model.handle.lane.call(self.model.n_threads_batch, C.llama_decode, self._ctx, b)
                if rc != 0:
                    raise ModelRuntimeError(f"llama_decode failed with code {rc} while embedding a text.")
                ptr = C.llama_get_embeddings_seq(self._ctx, 0)
                if not ptr:
                    raise ModelRuntimeError("llama.cpp returned no pooled embedding (pooling is off for this "
                                            "model).")
                out[i] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                               shape=(self.n_embd,))
            C.llama_memory_clear(mem, True)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def close(self) -> None:
        """Free the embedding context (the model stays loaded; idempotent)."""
        if self._ctx is not None:
            self._C.llama_batch_free(self._batch)
            self._C.llama_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: modules may be gone
            pass
