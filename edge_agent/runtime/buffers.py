"""The llama_batch the runtime decodes with: numpy buffers it owns, filled with vectorised numpy.

Knows the ``llama_batch`` struct's fields and how one run of tokens in seq 0 fills it. Does not know
contexts or decoding: :class:`~edge_agent.runtime.handle.Handle` owns one and decodes it.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any, cast

import numpy as np

from edge_agent.runtime._lib import C


class BatchBuffers:
    """A llama_batch whose arrays are numpy buffers we own (filled with vectorised numpy, no per-token
    ctypes).

    Shapes: tok/pos/nseq (cap,) int32, seq (cap, n_seq_max) int32, out (cap,) int8.
    """

    def __init__(self, cap: int, n_seq_max: int) -> None:
        self.cap = cap
        self.tok = np.zeros(cap, dtype=np.int32)
        self.pos = np.zeros(cap, dtype=np.int32)
        self.nseq = np.ones(cap, dtype=np.int32)
        self.seq = np.zeros((cap, n_seq_max), dtype=np.int32)
        self.out = np.zeros(cap, dtype=np.int8)
        # seq_id is int32**: one pointer per row of self.seq.
        self._ptrs = (self.seq.ctypes.data + np.arange(cap,
                                                       dtype=np.uintp) * self.seq.strides[0]).astype(np.uintp)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self.struct: Any = cast(Any,
                                # ctypes struct; its pointer fields point into the arrays above
                                C.llama_batch())
        self.struct.n_tokens = 0
        self.struct.token = self.tok.ctypes.data_as(i32p)
        self.struct.embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.pos = self.pos.ctypes.data_as(i32p)
        self.struct.n_seq_id = self.nseq.ctypes.data_as(i32p)
        self.struct.seq_id = ctypes.cast(self._ptrs.ctypes.data,
                                         ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.struct.logits = self.out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill_run(self, tokens: Any, p0: int, *, last_logits: bool) -> int:
        """Rows for ``tokens`` (at most ``cap``) in seq 0 at positions p0.., logits for the last row only
        when ``last_logits``. Returns the row count."""
        m = len(tokens)
        self.tok[:m] = tokens
        self.pos[:m] = np.arange(p0, p0 + m, dtype=np.int32)
        self.nseq[:m] = 1
        self.seq[:m, 0] = 0
        self.out[:m] = 0
        if last_logits and m:
            self.out[m - 1] = 1
        return m


def prefaulted_bytes(size: int) -> np.ndarray:
    """(size,) uint8 in a new anonymous mapping whose pages the kernel fills in at once (``MAP_POPULATE``,
    Linux; elsewhere a plain numpy array), contents undefined: for a context's state (~200 MB of KV bytes
    at 2B after a photo question), copied out after every answer. A fresh numpy array that size costs its
    page faults on the answer's path, often more than the copy: numpy asks for transparent huge pages, and
    with the usual ``defrag = madvise`` a fault there waits while the kernel compacts memory.
    ``scripts/bench_state_save.py`` (2B stand-in, ~1,900 cells, 218 MB, 2 cores, interleaved): numpy
    0.04 s when huge pages are at hand, else 0.35-1.3 s (medians 0.13-0.55 s over four runs); a plain
    anonymous mapping 0.18 s; pre-faulted 0.09 s (0.08-0.21 after the first). Nothing is kept: the memory
    goes when the state does (a reused buffer, 0.025 s, held ~230 MiB for good: peak RSS 2,444 MiB)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate or size <= 0:
        return np.empty(size, dtype=np.uint8)
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | populate
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=np.uint8)
