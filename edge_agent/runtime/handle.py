"""The low-level handle of one loaded model: the llama.cpp pointers and every call that touches them.

Knows: loading the weights and creating one context (+ an mtmd vision context) from given parameters;
the vocabulary's raw calls; one reusable batch of numpy buffers (:class:`BatchBuffers`) and decoding
it; the KV memory calls (remove, copy, ranges, one sequence's state bytes); the logits buffer; the lock
that keeps llama.cpp calls on this context one at a time; the abort flag (a cancel, ``interrupt``, a
preemption by the foreground model) and the share of the CPU cores (``computing`` / ``resume_after``);
the token-data buffer of the grammar sampler; which session owns the context now.

Does not know: what the files are or whether they are valid (``model``), the text rules of tokens
(``tokenizer``), a conversation's history, positions or pending tokens (``session``), candidate tries
(``batch``), chat formats. Every other module of ``runtime`` reaches llama.cpp through this one's
public methods (``vision`` and ``sampling`` also through its ``mtmd`` / ``vocab`` pointers); this
module imports no other runtime module but ``_lib`` and ``cores``.

One context holds ``n_seq_max`` sequences in one unified KV cache of ``n_ctx`` cells: seq 0 is the
conversation, seqs 1..n_seq_max-1 are scratch for candidate scoring.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core.errors import Cancelled, ModelFileError, ModelRuntimeError
from edge_agent.runtime import _lib
from edge_agent.runtime._lib import C, M
from edge_agent.runtime.buffers import BatchBuffers, prefaulted_bytes
from edge_agent.runtime.cores import BACKGROUND, FOREGROUND, ComputeLane, CoreShare, Step
from edge_agent.runtime.tower import VisionTower

# llama_token_data {int32 id; float logit; float p} as a numpy record (12 bytes, no padding).
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
_U8P = ctypes.POINTER(ctypes.c_uint8)
_NO_CALLBACK = M.mtmd_helper_post_decode_callback()  # a NULL function pointer: no per-batch callback


class ContextFull(ModelRuntimeError):
    """llama.cpp found no room for ``need`` more tokens (a session re-raises it with its own counts)."""

    def __init__(self, need: int, n_ctx: int) -> None:
        super().__init__(f"The context is full: {need} more tokens do not fit its {n_ctx} cells. Start a new "
                         "chat, or raise n_ctx in the settings.", title="Context full")
        self.need = need


@dataclass(frozen=True)
class Params:
    """How to load: the context's shape, threads and cache type (``Model.load`` checks the values)."""

    n_ctx: int  # cells the context is created with
    n_seq_max: int
    n_batch: int
    n_threads: int
    n_threads_batch: int
    extra_buffers: bool  # llama.cpp's use_extra_bufts (repacked weights)
    kv_type: str  # a key of _lib.KV_TYPES
    flash_attn: str  # auto | on | off
    image_tokens: tuple[int, int] = (0, 0)  # mtmd's (min, max) tokens per image; 0: the projector's
    n_ctx_max: int = 0  # the most cells it may grow to (:meth:`Handle.grow`); 0: n_ctx, it never grows


class Handle:
    """One model's weights, context, vocabulary and mtmd context in llama.cpp. Create with :meth:`open`."""

    def __init__(self, path: Path, params: Params) -> None:  # use Handle.open()
        self.path = path
        self.params = params
        self._model: Any = None
        self._ctx: Any = None
        self._vocab: Any = None
        self._vision: VisionTower | None = None
        self._mem: Any = None
        self._tdata: np.ndarray | None = None
        self._interrupted = False  # interrupt() was called since the running call began (not a preemption)
        self.lock = threading.RLock()  # one llama.cpp call sequence at a time on this context
        self.abort = _lib.AbortFlag()  # polled by llama.cpp between graph nodes
        self.owner: object | None = None  # the session that owns the context now (claim())
        self.n_threads, self.n_threads_batch = params.n_threads, params.n_threads_batch
        self.flash_attn = params.flash_attn  # as applied: on, off, or auto (llama.cpp decides)
        self.n_ctx = self.n_batch = self.n_seq_max = self.n_vocab = 0
        self.add_bos, self.bos, self.eos = False, -1, -1
        self.has_vision = False
        self.vision_borrowed = False  # the vision tower is another model's (shared, not loaded here)
        self.batch: BatchBuffers | None = None
        self.decodes = 0  # llama_decode calls (an image counts once): the logits buffer's version
        self.vision_encodes = 0  # images this model's projector encoded (reused embeddings not counted)
        # sharing the cores with another model computing at once (SeProD's prophet): see runtime.cores
        self.cores: CoreShare | None = None
        self.role = FOREGROUND
        self._threads_now = (0, 0)  # (decode, batch) threads the context computes with now
        self.lane = ComputeLane(path.name)  # where its multi-threaded passes run (cores.ComputeLane)

    # ------------------------------------------------------------------------------ loading
    @classmethod
    def open(cls, path: Path, mmproj: Path | None, params: Params, *, vision_key: str = "",
             share_vision: VisionTower | None = None) -> Handle:
        """Load the weights, create the context (and the mtmd context for ``mmproj``). The files must
        have been validated (llama.cpp aborts the process on several bad files). Raises ModelFileError /
        ModelRuntimeError; nothing stays allocated then. ``vision_key``: what fixes the projector (the
        mmproj file's identity and the image-token limits); ``share_vision``: another model's tower,
        used instead of loading one when its key is ``vision_key`` and this model's embedding width and
        vocabulary size are its own (else this model loads its own)."""
        _lib.ensure_init()
        h = cls(path, params)
        try:
            h._load_weights()
            h._create_context()
            if mmproj is not None:
                if share_vision is not None and h._fits(share_vision, vision_key):
                    h._vision = share_vision.share()
                    h.has_vision = h.vision_borrowed = True
                else:
                    h._init_vision(mmproj, vision_key)
        except BaseException:
            h.close()
            raise
        return h

    def _load_weights(self) -> None:
        _lib.clear_errors()
        mp = C.llama_model_default_params()
        mp.use_extra_bufts = self.params.extra_buffers
        if self.params.extra_buffers:
            # Read the file instead of mapping it: a repacked matrix is copied into its kernel's layout
            # and the mapping kept its file pages resident as well. Qwen3-VL-2B stand-in (Q4_K_M,
            # 1.05 GB): 1,765 MB resident after loading mapped (691 MB repacked + 1,073 MB of file
            # pages), 1,126 MB read (scripts/bench_question.py measures the whole app's peak).
            mp.load_mode = C.LLAMA_LOAD_MODE_NONE
        self._model = C.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            raise ModelFileError(
                f"llama.cpp could not load {self.path} ({_lib.recent_errors() or 'no details'}). "
                "Check that it is a complete text-model GGUF supported by llama-cpp-python 0.3.36."
            )
        self._vocab = C.llama_model_get_vocab(self._model)
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(C.llama_vocab_bos(self._vocab))
        self.eos = int(C.llama_vocab_eos(self._vocab))

    def _create_context(self) -> None:
        p = self.params
        cp = C.llama_context_default_params()
        cp.n_ctx = p.n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = p.n_batch
        cp.n_seq_max = p.n_seq_max
        cp.n_threads = p.n_threads
        cp.n_threads_batch = p.n_threads_batch
        cp.kv_unified = True  # else each sequence gets n_ctx / n_seq_max cells
        cp.type_k = _lib.KV_TYPES[p.kv_type]
        cp.type_v = _lib.KV_TYPES[p.kv_type]
        # auto: off on CPU-only builds and with an F32 KV cache, else llama.cpp's own choice. CPU, off vs on:
        # SmolLM2-135M Q4_K_M scored the library in 334 vs 459 ms and decoded 25.8 vs 31.8 ms/token; the 2B
        # stand-in decodes after 1,800 cells at 98 vs 135 ms (f16; scripts/bench_defaults.py); off takes a
        # larger compute buffer (166 vs 98 MiB at n_ctx 8192, n_batch 512). Batched vs token-by-token
        # numerics: SmolLM2 Q4_1 0.073 log-prob off, 1.5e-8 on; on Q4_K weights the batched matmul kernels
        # differ either way (Qwen2.5-0.5B: 0.25 in a logit). F32 KV: the CPU flash-attention kernel rounds
        # through F16 (3e-4 on the tiny model, 2.5e-6 off). A q8_0 V cache needs it on (llama.cpp refuses).
        flash_attn = p.flash_attn
        if flash_attn == "auto" and p.kv_type == "q8_0":
            flash_attn = "on"
        elif flash_attn == "auto" and (p.kv_type == "f32" or not C.llama_supports_gpu_offload()):
            flash_attn = "off"
        self.flash_attn = flash_attn
        cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[flash_attn]
        cp.no_perf = True
        cp.embeddings = False
        self._ctx = C.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise ModelRuntimeError(
                f"llama.cpp could not create a context of {p.n_ctx} tokens for {self.path.name} "
                f"({_lib.recent_errors() or 'no details'}). Lower n_ctx or free memory."
            )
        self._mem = C.llama_get_memory(self._ctx)
        self._threads_now = (self.n_threads, self.n_threads_batch)
        self.abort.install(self._ctx)
        self.n_ctx = C.llama_n_ctx(self._ctx)
        self.n_batch = min(C.llama_n_batch(self._ctx), C.llama_n_ubatch(self._ctx))
        self.n_seq_max = C.llama_n_seq_max(self._ctx)
        self.batch = BatchBuffers(self.n_batch, self.n_seq_max)

    @property
    def n_ctx_max(self) -> int:
        return max(self.params.n_ctx_max, self.n_ctx)

    def grow(self, cells: int) -> None:
        """Make room for ``cells`` cells when the context may grow that far (up to ``n_ctx_max``; at least
        doubling, in steps of 1,024): the context is created again, larger, and seq 0's cells are copied
        into it (their bytes, so every number is the same: a context's size changes none of them).
        Scratch sequences are dropped; callers grow only between calls that use them. Costs two copies
        of seq 0's KV bytes (~0.3 s at 4,096 f16 cells of a 2B model) and, meanwhile, their memory."""
        if cells <= self.n_ctx or self.n_ctx >= self.n_ctx_max:
            return
        with self.lock:
            n = min(self.n_ctx_max, max(2 * self.n_ctx, -(-cells // 1024) * 1024))
            kv = self.state_bytes(0) if self.seq_range(0) is not None else None
            C.llama_free(self._ctx)
            self._ctx = None
            self.params = replace(self.params, n_ctx=n)
            self._create_context()
            if kv is not None and not self.set_state_bytes(kv, 0):
                raise ModelRuntimeError(f"Growing the context to {n} cells lost its contents "
                                        f"({_lib.recent_errors() or 'no details'}). Start a new chat.")

    def _fits(self, tower: VisionTower, key: str) -> bool:
        return bool(key) and tower.key == key and bool(tower.ptr) and tower.n_embd_inp == self.n_embd_inp \
            and tower.n_vocab == self.n_vocab

    def _init_vision(self, mmproj: Path, key: str) -> None:
        lo, hi = self.params.image_tokens
        mparams = M.mtmd_context_params_default()
        mparams.use_gpu = False
        mparams.print_timings = False
        mparams.n_threads = self.n_threads_batch
        mparams.warmup = False
        if lo > 0:
            mparams.image_min_tokens = lo
        if hi > 0:
            mparams.image_max_tokens = hi
        _lib.clear_errors()
        ptr = M.mtmd_init_from_file(str(mmproj).encode(), self._model, mparams)
        if not ptr:
            raise ModelFileError(
                f"The vision projector {mmproj.name} does not fit {self.path.name} "
                f"({_lib.recent_errors() or 'mtmd_init_from_file failed'}). "
                "Use the mmproj file published with this exact model."
            )
        self._vision = VisionTower(ptr, key, self.n_threads_batch, self.n_embd_inp, self.n_vocab, self.lane)
        if not M.mtmd_support_vision(ptr):
            raise ModelFileError(f"{mmproj.name} is not a vision projector. Use the model's image mmproj.")
        self.has_vision = True

    def memory_bytes(self, arch: str) -> dict[str, int]:
        """{"model": weights, "kv_cache": n_ctx * n_layer * (k + v widths) * bytes(kv_type)} (unified:
        whatever the number of sequences). ``arch`` names the GGUF keys of the head widths."""
        n_layer = C.llama_model_n_layer(self._model)
        n_embd = C.llama_model_n_embd(self._model)
        n_head = max(1, C.llama_model_n_head(self._model))
        n_head_kv = C.llama_model_n_head_kv(self._model)
        head = self._meta_int(f"{arch}.attention.key_length") or n_embd // n_head
        head_v = self._meta_int(f"{arch}.attention.value_length") or head
        kv_elem = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}[self.params.kv_type]
        return {
            "model": int(C.llama_model_size(self._model)),
            "kv_cache": int(self.n_ctx * n_layer * n_head_kv * (head + head_v) * kv_elem),
        }

    def _meta_int(self, key: str) -> int:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_model_meta_val_str(self._model, key.encode(), buf, 64)
        if n < 0:
            return 0
        try:
            return int(buf.value.decode())
        except ValueError:
            return 0

    # ------------------------------------------------------------------------------ pointers
    @property
    def vocab(self) -> Any:
        """The llama_vocab pointer (``sampling`` builds grammar samplers on it)."""
        return self._vocab

    @property
    def mtmd(self) -> Any:
        """The mtmd context pointer, None without a projector (``vision`` tokenizes and encodes with it,
        under :attr:`vision`'s lock)."""
        return self._vision.ptr if self._vision is not None else None

    @property
    def vision(self) -> VisionTower | None:
        """The vision tower this model uses (its own, or one shared with another model), None without."""
        return self._vision

    @property
    def llama_model(self) -> Any:
        """The llama_model pointer (``embed`` opens a second context on the same weights)."""
        return self._model

    # ------------------------------------------------------------------------------ vocabulary
    def tokenize(self, text: str, special: bool) -> list[int]:
        """llama_tokenize: no BOS added; ``special`` parses control and user-defined token texts."""
        if not text:
            return []
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self._vocab, raw, len(raw), buf, cap, False, special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self._vocab, raw, len(raw), buf, cap, False, special)
        if n < 0:
            raise ModelRuntimeError(f"Could not tokenize a text of {len(raw)} bytes.")
        return list(buf[:n])

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:  # llama.cpp would throw (and abort the process)
            raise ValueError(f"token id {token} out of range [0, {self.n_vocab})")

    def piece(self, token: int, special: bool) -> bytes:
        """Raw bytes of one token (control tokens render as b'' unless ``special``)."""
        self._check_token(token)
        self.check_open()
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[: max(n, 0)]

    def token_text(self, token: int) -> str:
        """The vocabulary's text of a token (for special tokens: its literal, e.g. '<|im_end|>')."""
        self._check_token(token)
        t = C.llama_vocab_get_text(self._vocab, token)
        return t.decode("utf-8", "replace") if t else ""

    def is_special(self, token: int) -> bool:
        """A control or user-defined token (its text must never come from untrusted input)."""
        mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED
        return bool(C.llama_vocab_get_attr(self._vocab, token) & mask)

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(C.llama_vocab_is_eog(self._vocab, token))

    def token_data(self) -> np.ndarray:
        """A (V,) llama_token_data record array with ids filled (reused: one per model, one user at a
        time)."""
        if self._tdata is None:
            self._tdata = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
            self._tdata["id"] = np.arange(self.n_vocab, dtype=np.int32)
        return self._tdata

    # ------------------------------------------------------------------------------ KV memory
    def claim(self, owner: object) -> None:
        """Clear the KV cache and make ``owner`` (a new session) the context's only user."""
        self.check_open()
        with self.lock:
            C.llama_memory_clear(self._mem, True)
            self.owner = owner

    def clear_memory(self) -> None:
        C.llama_memory_clear(self._mem, True)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        """Remove the cells of ``seq`` at positions [p0, p1) (-1: open end)."""
        C.llama_memory_seq_rm(self._mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Give ``dst`` the cells of ``src`` at positions [p0, p1) (metadata only, unified cache)."""
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_range(self, seq: int) -> tuple[int, int] | None:
        """(min pos, max pos) of the cells of ``seq``, None when it holds none."""
        hi = int(C.llama_memory_seq_pos_max(self._mem, seq))
        return None if hi < 0 else (int(C.llama_memory_seq_pos_min(self._mem, seq)), hi)

    def state_bytes(self, seq: int) -> np.ndarray:
        """(bytes,) uint8 copy of one sequence's KV state (llama_state_seq_get_data), into pages faulted
        in at once (:func:`~edge_agent.runtime.buffers.prefaulted_bytes`)."""
        size = int(C.llama_state_seq_get_size(self._ctx, seq))
        kv = prefaulted_bytes(size)
        got = int(C.llama_state_seq_get_data(self._ctx, kv.ctypes.data_as(_U8P), size, seq))
        if got != size:
            raise ModelRuntimeError(f"llama.cpp copied {got} of {size} bytes of the context state.")
        return kv

    def set_state_bytes(self, kv: np.ndarray, seq: int) -> bool:
        """Load a sequence's KV state; False when llama.cpp did not take it."""
        return int(C.llama_state_seq_set_data(self._ctx, kv.ctypes.data_as(_U8P), kv.nbytes, seq)) != 0

    # ------------------------------------------------------------------------------ decoding
    def decode(self, n: int) -> None:
        """llama_decode the first ``n`` rows of :attr:`batch`, again after a preemption by the foreground
        model. Raises ContextFull, Cancelled (the abort flag; processed ubatches stay: callers remove
        them) or ModelRuntimeError."""
        b = self.batch
        assert b is not None and n <= b.cap
        b.struct.n_tokens = n
        while True:
            _lib.clear_errors()
            with self.computing(n) as step:
                rc = self._compute(n, C.llama_decode, self._ctx, b.struct)
            # preempted by the foreground model: llama.cpp removed the aborted ubatch's cells; again
            if not (rc == 2 and self.resume_after(step)):
                break
        self.decodes += 1
        if rc != 0:
            if rc == 1:
                raise ContextFull(n, self.n_ctx)
            if rc == 2:
                raise Cancelled()
            raise ModelRuntimeError(f"llama_decode failed with code {rc} "
                                    f"({_lib.recent_errors() or 'no details'}).")

    def logits_rows(self, n_rows: int) -> np.ndarray:
        """Zero-copy (n_rows, V) float32 view of llama.cpp's logits buffer (valid until the next decode)."""
        return np.ctypeslib.as_array(C.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab))

    def last_logits(self) -> np.ndarray:
        """(V,) float32 copy of the last decode's last logits row."""
        return np.ctypeslib.as_array(C.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,)).copy()

    def decode_image(self, chunk: object, embd: np.ndarray, n_past: int, seq: int, n_tokens: int) -> int:
        """Decode an image embedding (``n_tokens`` x n_embd float32) into ``seq`` from ``n_past``, again
        after a preemption by the foreground model; returns the new position. On failure the partial
        cells are removed; raises Cancelled (the abort flag) or ModelRuntimeError."""
        self.decodes += 1
        new_pos = C.llama_pos(0)
        ptr = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        while True:
            _lib.clear_errors()
            with self.computing(n_tokens) as step:
                rc = self._compute(n_tokens, M.mtmd_helper_decode_image_chunk, self.mtmd, self._ctx, chunk,
                                   ptr,
                                   n_past, seq, self.n_batch, ctypes.byref(new_pos), _NO_CALLBACK, None)
            if rc == 0:
                return int(new_pos.value)
            self.seq_rm(seq, n_past, -1)
            if self.resume_after(step):  # preempted by the foreground model: decode it again
                continue
            if self.abort.is_set():
                raise Cancelled()
            raise ModelRuntimeError(f"Evaluating the image failed (code {rc}; "
                                    f"{_lib.recent_errors() or 'no details'}).")

    def _compute(self, n_tokens: int, fn: Any, *args: Any) -> int:
        """One llama.cpp pass: on the model's lane when it uses more than one thread (the threads set on
        the context now: decode threads for one token, batch threads for more), else here."""
        return int(self.lane.call(self._threads_now[0 if n_tokens == 1 else 1], fn, *args))

    def count_encode(self) -> None:
        """One more image encoded by this model's projector (``vision`` calls it after each encode)."""
        self.vision_encodes += 1

    @property
    def n_embd_inp(self) -> int:
        """Width of one image-embedding row the model takes (mtmd's output)."""
        return int(C.llama_model_n_embd_inp(self._model))

    # ------------------------------------------------------------------------------ cancel and cores
    @contextlib.contextmanager
    def cancellable(self, cancel: threading.Event | None, *, raise_if_set: bool = True) -> Iterator[None]:
        """Run one public call so that ``cancel`` (or :meth:`interrupt`) aborts a running llama_decode.

        A watcher thread mirrors the Event into the C-level abort flag (llama.cpp polls it between graph
        nodes); an aborted decode raises ``Cancelled``. An interrupt that came while nothing was
        decoding is dropped here.
        """
        flag = self.abort
        if raise_if_set and cancel is not None and cancel.is_set():
            raise Cancelled()
        self._interrupted = False
        flag.clear()
        try:
            if cancel is None or not flag.available:
                yield
            else:
                with flag.watching(cancel):
                    yield
        finally:
            flag.clear()

    def interrupt(self) -> None:
        """Abort the llama_decode running now (from any thread): the call raises ``Cancelled``.

        Image encoding inside the vision projector is not interruptible.
        """
        self._interrupted = True
        self.abort.set()

    def share_cores(self, cores: CoreShare | None, role: str = FOREGROUND, *, n_threads: int = 0) -> None:
        """Compute within ``cores`` from now on, as the ``role`` (``runtime.cores``); None: alone.
        ``n_threads`` > 0: token-by-token decoding uses that many threads from now on."""
        if role not in (FOREGROUND, BACKGROUND):
            raise ValueError(f"role must be {FOREGROUND!r} or {BACKGROUND!r}")
        self.cores, self.role = cores, role
        if n_threads > 0:
            self.n_threads = n_threads
        self._use_threads(self.n_threads, self.n_threads_batch)

    @property
    def threads_now(self) -> tuple[int, int]:
        """(decode, batch) threads the context computes with now."""
        return self._threads_now

    def _use_threads(self, n: int, n_batch: int) -> None:
        if self._ctx and (n, n_batch) != self._threads_now:
            C.llama_set_n_threads(self._ctx, n, n_batch)
            self._threads_now = (n, n_batch)

    @contextlib.contextmanager
    def computing(self, n_tokens: int, *, encode: bool = False) -> Iterator[Step | None]:
        """Around every llama_decode of ``n_tokens`` tokens and every image encode on this context.

        Alone (no :attr:`cores`): nothing. Sharing: a foreground pass computes now with the threads it
        is given (set on the context for this pass); a background step waits until it fits beside the
        foreground (a set abort flag ends the wait) and yields its :class:`~edge_agent.runtime.cores.Step`:
        ``preempted`` after the foreground stopped it through the abort flag, and the caller runs it
        again. An encode's threads are the projector's, fixed at load: it is counted, not stopped.
        """
        share = self.cores
        if share is None:
            yield None
            return
        if encode:  # the projector's threads (a shared tower keeps its loader's)
            want = self._vision.n_threads if self._vision is not None else self.n_threads_batch
        else:
            want = self.n_threads if n_tokens == 1 else self.n_threads_batch
        if self.role == BACKGROUND:
            flag = self.abort
            with share.background(want, stop=flag.is_set,
                                  preempt=flag.set if flag.available and not encode else None) as step:
                yield step
            if step.preempted and not flag.cancel_requested() and not self._interrupted:
                flag.clear()  # the step may have finished before the flag was seen: it must not stop the next
            return
        with share.foreground(want) as n:
            if not encode:  # llama.cpp uses n_threads for one token and n_threads_batch for more
                if n_tokens == 1:
                    self._use_threads(n, self.n_threads_batch)
                else:
                    self._use_threads(self.n_threads, n)
            yield None

    def resume_after(self, step: Step | None) -> bool:
        """After an aborted decode: True when only the foreground's preemption stopped it (the flag is
        cleared and the caller runs the decode again), False when it was a real cancel."""
        flag = self.abort
        if step is None or not step.preempted or flag.cancel_requested() or self._interrupted:
            return False
        flag.clear()
        return True

    # ------------------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._model is None

    def check_open(self, message: str = "This model was closed. Load it again.") -> None:
        if self._model is None:
            raise ModelRuntimeError(message)

    def close(self) -> None:
        """Free the mtmd context, the llama context and the model (idempotent). A vision tower another
        model still uses stays, and so do the weights it was loaded with (mtmd tokenizes with them):
        the tower's last holder frees both."""
        with self.lock:
            self.owner = None
            weights_kept = False
            if self._vision is not None:
                loader = self._model if self._model and not self.vision_borrowed else None
                weights_kept = self._vision.release(loader)
            self._vision = None
            self.lane.close()
            if self._ctx:
                C.llama_free(self._ctx)
            self._ctx = None
            self._mem = None
            if self._model and not weights_kept:
                C.llama_model_free(self._model)
            self._model = None
            self.batch = None
