"""A vision tower (one mtmd context) that two models can share.

Knows: the mtmd context pointer, what it was loaded for (``key``: the mmproj file's identity and the
image-token limits; the embedding width and vocabulary size a model needs to use it), who holds it,
its lock and the compute lane its encodes run on. Does not know images, embeddings or caches
(``vision``), nor how it was created (``handle``).
"""

from __future__ import annotations

import threading
from typing import Any

from edge_agent.core.errors import ModelRuntimeError
from edge_agent.runtime._lib import C, M
from edge_agent.runtime.cores import ComputeLane


class VisionTower:
    """One mtmd context: the vision projector's weights (Qwen3-VL-2B: ~0.42 GB in Q8_0) and its encode
    buffers. Models loaded with the same mmproj file share one (SeProD's prophet reads the agent's):
    ``share`` / ``release`` count the holders and the last release frees it.

    mtmd uses its text model only at load (the embedding width it must produce) and for the text
    chunks of ``mtmd_tokenize`` (the vocabulary): a model with the same width and vocabulary can
    use it. Encoding writes the context's output buffer, so every ``mtmd_tokenize`` and
    ``mtmd_encode_chunk`` on it runs under :attr:`lock`; decoding an embedding into a llama context
    only reads its flags (M-RoPE, causal attention). Encodes run on the loader's compute lane
    (``cores.ComputeLane``): one OpenMP team per model, whichever model encodes."""

    def __init__(self, ptr: Any, key: str, n_threads: int, n_embd_inp: int, n_vocab: int,
                 lane: ComputeLane) -> None:
        self.ptr, self.key, self.n_threads, self.lane = ptr, key, n_threads, lane
        self.n_embd_inp, self.n_vocab = n_embd_inp, n_vocab  # what a model must match to use it
        self.lock = threading.Lock()
        self._holders = 1
        self._loader_weights: Any = None  # the loader's llama_model, once the loader closed first

    def share(self) -> VisionTower:
        """One more holder (raises when it was freed already)."""
        with self.lock:
            if not self.ptr:
                raise ModelRuntimeError("The vision projector to share was closed. Load the model again.")
            self._holders += 1
            return self

    def release(self, loader_weights: Any = None) -> bool:
        """One holder fewer; the last frees the mtmd context. ``loader_weights``: the llama_model of
        the loader, closing while others still hold the tower (mtmd tokenizes with it): the tower
        keeps it and frees it with itself. True when it kept them (the loader must not free them)."""
        with self.lock:
            self._holders -= 1
            if self._holders > 0 and self.ptr:
                if loader_weights is not None:
                    self._loader_weights = loader_weights
                return loader_weights is not None
            if self.ptr:
                M.mtmd_free(self.ptr)
                self.ptr = None
            if self._loader_weights is not None:
                C.llama_model_free(self._loader_weights)
                self._loader_weights = None
            return False

    @property
    def holders(self) -> int:
        return self._holders

    def encode(self, chunk: object) -> int:
        """``mtmd_encode_chunk`` (the caller holds :attr:`lock`); its return code."""
        return int(self.lane.call(self.n_threads, M.mtmd_encode_chunk, self.ptr, chunk))
