"""The llama_batch the runtime decodes with: numpy buffers it owns, filled with vectorised numpy.

Knows the ``llama_batch`` struct's fields and how one run of tokens in seq 0 fills it. Does not know
contexts or decoding: :class:`~edge_agent.runtime.handle.Handle` owns one and decodes it.
"""

from __future__ import annotations

import ctypes
import sys
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


class ReusedBytes:
    """One large byte buffer handed out again once nobody holds what it gave: a context's state (~200 MB
    of KV bytes at 2B after a photo question) is copied out after every answer, and a fresh buffer that
    size costs its page faults on the answer's path, more than the copy: 0.1 s at 4 KB pages, 0.02-1.4 s
    with the transparent huge pages numpy asks for (the first in a process waits while the kernel
    compacts memory), against ~0.03 s for the copy itself (2B stand-in, 1,801 cells, 207 MB, 2 cores).

    :meth:`take` returns a view of the kept buffer when nothing refers to it any more (the saved state
    written and dropped: every view of it, and every view of a view, holds a reference to it), else a new
    array (kept instead when it is larger and the old one is free). The kept buffer stays allocated for
    the process's life: the memory a save needs at its peak anyway.
    """

    def __init__(self) -> None:
        self._base: np.ndarray | None = None

    def _free(self) -> bool:
        return self._base is None or sys.getrefcount(self._base) <= 2  # this attribute, the call's argument

    def take(self, size: int) -> np.ndarray:
        """(size,) uint8, contents undefined; the caller fills all of it."""
        if not self._free():  # the last one is still held (being written): a one-off buffer
            return np.empty(size, dtype=np.uint8)
        if self._base is None or self._base.nbytes < size:
            self._base = None
            self._base = np.empty(size + size // 8, dtype=np.uint8)  # room to grow a little
        return self._base[:size]
