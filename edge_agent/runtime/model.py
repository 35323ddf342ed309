"""A loaded model: llama.cpp model + one context (+ an mtmd vision context), on the low-level API.

Knows: file validation before llama.cpp sees a file (through ``edge_agent.modelfile``), context
parameters (sequences for batched scoring, unified KV, batch sizes, threads, KV type), tokenization
and detokenization, memory accounting, freeing. Does not know: chat formats, prompts, the agent, or
where model files come from (catalog, downloads): callers hand it paths.

One context per model, owned by at most one live :class:`Session` at a time (``session()`` clears the
KV cache and retires the previous session). The context holds ``n_seq_max`` sequences in one unified
KV cache of ``n_ctx`` cells: seq 0 is the conversation, seqs 1..n_seq_max-1 are scratch for candidate
scoring. Memory: the KV cache costs ``n_ctx * n_layer * (k + v widths) * bytes(kv_type)`` whatever the
number of sequences (unified); see :attr:`Model.memory_bytes`.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.errors import ModelFileError, ModelRuntimeError
from edge_agent.runtime.cores import BACKGROUND, FOREGROUND, CoreShare, Step

if TYPE_CHECKING:
    from edge_agent.runtime import _lib

# llama_cpp is imported on first use (Model.load), not when this module is imported, so
# ``from edge_agent.runtime import Model`` stays cheap for code that only names the class.
C: Any = None
M: Any = None


def _bind() -> Any:
    """Import the binding (edge_agent.runtime._lib) once; set this module's C and M; return _lib."""
    global C, M
    from edge_agent.runtime import _lib as lib

    C, M = lib.C, lib.M
    return lib

if TYPE_CHECKING:
    from edge_agent.config import Settings
    from edge_agent.runtime.session import Session
    from edge_agent.runtime.state import SessionState

# A batch larger than n_batch aborts llama.cpp (GGML_ASSERT): every decode is split to fit.
DEFAULT_N_BATCH = 512


class _Batch:
    """A llama_batch whose arrays are numpy buffers we own (filled with vectorised numpy, no per-token ctypes).

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
        self._ptrs = (self.seq.ctypes.data + np.arange(cap, dtype=np.uintp) * self.seq.strides[0]).astype(np.uintp)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self.struct = C.llama_batch()
        self.struct.n_tokens = 0
        self.struct.token = self.tok.ctypes.data_as(i32p)
        self.struct.embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.pos = self.pos.ctypes.data_as(i32p)
        self.struct.n_seq_id = self.nseq.ctypes.data_as(i32p)
        self.struct.seq_id = ctypes.cast(self._ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.struct.logits = self.out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


class Model:
    """A text GGUF (+ optional mmproj) loaded into llama.cpp. Create with :meth:`load`."""

    def __init__(self) -> None:  # use Model.load()
        self._model: Any = None
        self._ctx: Any = None
        self._mtmd: Any = None
        self._vocab: Any = None
        self._batch: _Batch | None = None
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._tdata: np.ndarray | None = None
        self._guard_re: re.Pattern[str] | None | bool = False  # False: not built yet
        self.lock = threading.RLock()  # one llama.cpp call sequence at a time on this context
        self.abort: _lib.AbortFlag | None = None  # polled by llama.cpp between graph nodes
        self.active_session: Session | None = None
        self.path: Path = Path()
        self.mmproj_path: Path | None = None
        self.n_ctx = 0
        self.n_batch = 0
        self.n_seq_max = 0
        self.n_vocab = 0
        self.n_threads = 0
        self.n_threads_batch = 0
        self.kv_type = "f16"
        self.extra_buffers = False
        self.flash_attn = "auto"  # as applied: on, off, or auto (llama.cpp decides)
        self.add_bos = False
        self.bos: int = -1
        self.eos: int = -1
        self.has_vision = False
        self.image_px_per_token = 0  # pixels per image-token side (patch * merge; 32 for Qwen3-VL), 0 unknown
        self.arch = ""
        self.info: Any = None  # edge_agent.modelfile.ModelInfo of the text model
        self.mmproj_info: Any = None
        self.memory_bytes: dict[str, int] = {}
        self.mmproj_identity = ""  # the mmproj file's identity: with an image and its grid, what fixes an embedding
        self.vision_identity = ""  # mmproj + mtmd's image limits: what fixes how an image becomes tokens
        self.vision_encodes = 0  # images this model's projector encoded (reused embeddings not counted)
        self.identity: dict[str, Any] = {}  # everything that changes this context's numbers (saved states)
        # sharing the cores with another model computing at once (SeProD's prophet): see runtime.cores
        self.cores: CoreShare | None = None
        self.role = FOREGROUND
        self._threads_now = (0, 0)  # (decode, batch) threads the context computes with now
        self.interrupted = False  # interrupt() was called since the running call began (not a preemption)

    # ------------------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        mmproj: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 8192,
        n_threads: int = 0,
        n_threads_batch: int = 0,
        n_seq_max: int = 8,
        n_batch: int = DEFAULT_N_BATCH,
        extra_buffers: str = "auto",
        kv_type: str = "f16",
        flash_attn: str = "auto",
        image_min_tokens: int = 0,
        image_max_tokens: int = 0,
        seed: int = 0,
    ) -> Model:
        """Validate the files in Python, then load them. Raises ModelFileError / ModelRuntimeError.

        ``n_seq_max``: 1 (conversation) + the most candidates scored in one decode (more are scored in
        groups). ``n_batch``: the most tokens per llama_decode (also the physical ubatch). ``kv_type``:
        f16 (default), f32 (exact comparisons in tests), q8_0. ``flash_attn``: auto|on|off (auto: off
        on CPU-only builds, where it measured slower, and with an f32 KV cache; else llama.cpp's choice).
        ``image_min_tokens`` / ``image_max_tokens``: bounds on the tokens one image becomes (0: the
        projector's defaults, 8..4096 for Qwen3-VL); a lower maximum makes big images cheaper on a CPU.
        ``seed`` is accepted for the ModelLike contract; sampling seeds are per ``generate`` call.
        """
        del seed
        _lib = _bind()
        path = Path(path)
        mm = Path(mmproj) if mmproj else None
        if extra_buffers not in ("auto", "on", "off"):
            raise ModelRuntimeError(f"extra_buffers must be auto, on or off, not {extra_buffers!r}.")
        if kv_type not in _lib.KV_TYPES:
            raise ModelRuntimeError(f"kv_type must be one of {', '.join(_lib.KV_TYPES)}, not {kv_type!r}.")
        if flash_attn not in ("auto", "on", "off"):
            raise ModelRuntimeError(f"flash_attn must be auto, on or off, not {flash_attn!r}.")
        if n_seq_max < 1 or n_ctx < 16 or n_batch < 1:
            raise ModelRuntimeError("n_seq_max must be >= 1, n_ctx >= 16 and n_batch >= 1.")
        info, mm_info = _validate_files(path, mm)

        _lib.ensure_init()
        self = cls()
        self.path, self.mmproj_path = path, mm
        self.info, self.mmproj_info = info, mm_info
        self.arch = info.architecture
        self.n_threads = _lib.default_threads(n_threads, decode=True)
        self.n_threads_batch = _lib.default_threads(n_threads_batch)
        self.extra_buffers = _lib.extra_buffers_enabled(extra_buffers)
        self.kv_type = kv_type
        try:
            self._load(
                n_ctx=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch, flash_attn=flash_attn,
                image_tokens=(image_min_tokens, image_max_tokens),
            )
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def from_settings(
        cls, settings: Settings, path: str | os.PathLike[str], mmproj: str | os.PathLike[str] | None = None, **kw: Any
    ) -> Model:
        """:meth:`load` with context size, threads and extra buffers taken from ``settings``."""
        kw.setdefault("n_ctx", settings.n_ctx)
        kw.setdefault("n_threads", settings.n_threads)
        kw.setdefault("n_threads_batch", settings.n_threads_batch)
        kw.setdefault("extra_buffers", settings.extra_buffers)
        kw.setdefault("seed", settings.seed)
        # mtmd caps every image at the larger budget (the engine fits originals and crops to their own)
        kw.setdefault("image_max_tokens", max(settings.image_max_tokens, settings.crop_max_tokens, 0))
        return cls.load(path, mmproj, **kw)

    def _load(self, *, n_ctx: int, n_seq_max: int, n_batch: int, flash_attn: str, image_tokens: tuple[int, int]) -> None:
        _lib = _bind()
        _lib.clear_errors()
        mp = C.llama_model_default_params()
        mp.use_extra_bufts = self.extra_buffers
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

        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq_max
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads_batch
        cp.kv_unified = True  # else each sequence gets n_ctx / n_seq_max cells
        cp.type_k = _lib.KV_TYPES[self.kv_type]
        cp.type_v = _lib.KV_TYPES[self.kv_type]
        # auto: off on CPU-only builds and with an F32 KV cache, else llama.cpp's own choice.
        # - CPU: measured A/B on SmolLM2-135M Q4_K_M, 1 thread, ~600-token context: scoring the
        #   23-token library 334 vs 459 ms and decoding 25.8 vs 31.8 ms/token, off vs on. The price is
        #   a larger compute buffer (166 vs 98 MiB at n_ctx 8192, n_batch 512), and batch-shape
        #   dependent numerics: on SmolLM2 Q4_1 a 12-token draft scored in one batch vs decoded token
        #   by token differed by up to 0.073 log-prob per token (0.013 in the mean) with it off, 1.5e-8
        #   with it on. Pass flash_attn="on" where batched == token-by-token must hold exactly.
        # - F32 KV (chosen for exactness): the CPU flash-attention kernel rounds through F16, which
        #   made token-by-token and batched logprobs differ by 3e-4 on the tiny model (2.5e-6 off).
        if flash_attn == "auto" and (self.kv_type == "f32" or not C.llama_supports_gpu_offload()):
            flash_attn = "off"
        self.flash_attn = flash_attn
        cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[flash_attn]
        cp.no_perf = True
        cp.embeddings = False
        self._ctx = C.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise ModelRuntimeError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {self.path.name} "
                f"({_lib.recent_errors() or 'no details'}). Lower n_ctx or free memory."
            )
        self._threads_now = (self.n_threads, self.n_threads_batch)
        self.abort = _lib.AbortFlag()
        self.abort.install(self._ctx)
        self.n_ctx = C.llama_n_ctx(self._ctx)
        self.n_batch = min(C.llama_n_batch(self._ctx), C.llama_n_ubatch(self._ctx))
        self.n_seq_max = C.llama_n_seq_max(self._ctx)
        self._batch = _Batch(self.n_batch, self.n_seq_max)

        if self.mmproj_path is not None:
            mparams = M.mtmd_context_params_default()
            mparams.use_gpu = False
            mparams.print_timings = False
            mparams.n_threads = self.n_threads_batch
            mparams.warmup = False
            if image_tokens[0] > 0:
                mparams.image_min_tokens = image_tokens[0]
            if image_tokens[1] > 0:
                mparams.image_max_tokens = image_tokens[1]
            _lib.clear_errors()
            self._mtmd = M.mtmd_init_from_file(str(self.mmproj_path).encode(), self._model, mparams)
            if not self._mtmd:
                raise ModelFileError(
                    f"The vision projector {self.mmproj_path.name} does not fit {self.path.name} "
                    f"({_lib.recent_errors() or 'mtmd_init_from_file failed'}). "
                    "Use the mmproj file published with this exact model."
                )
            if not M.mtmd_support_vision(self._mtmd):
                raise ModelFileError(f"{self.mmproj_path.name} is not a vision projector. Use the model's image mmproj.")
            self.has_vision = True
            self.mmproj_identity = file_identity(self.mmproj_path)
            self.vision_identity = f"{self.mmproj_identity}:{image_tokens[0]}:{image_tokens[1]}"
            mi = self.mmproj_info
            self.image_px_per_token = mi.patch_size * (mi.spatial_merge_size or 1) if mi is not None else 0

        self.identity = {
            "model": file_identity(self.path),
            "vision": self.vision_identity,
            "kv_type": self.kv_type,
            "flash_attn": self.flash_attn,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "llama": _lib.library_identity(),
        }
        n_layer = C.llama_model_n_layer(self._model)
        n_embd = C.llama_model_n_embd(self._model)
        n_head = max(1, C.llama_model_n_head(self._model))
        n_head_kv = C.llama_model_n_head_kv(self._model)
        head = _meta_int(self._model, f"{self.arch}.attention.key_length") or n_embd // n_head
        head_v = _meta_int(self._model, f"{self.arch}.attention.value_length") or head
        kv_elem = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}[self.kv_type]
        self.memory_bytes = {
            "model": int(C.llama_model_size(self._model)),
            "kv_cache": int(self.n_ctx * n_layer * n_head_kv * (head + head_v) * kv_elem),
            "mmproj": int(self.mmproj_path.stat().st_size) if self.mmproj_path else 0,
        }

    # ------------------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text`` (no BOS added). ``special=False``: ``<|im_end|>``, ``<tool_call>`` etc. stay plain text.

        llama.cpp's ``parse_special=False`` only protects CONTROL tokens: USER_DEFINED ones such as
        ``</tool_response>`` or ``<tool_call>`` are still matched, so a search snippet could close the
        tool response and forge a tool call. For untrusted text we therefore cut every occurrence of a
        non-normal token's text after its first character, so it is spelled with ordinary tokens.
        """
        self._check_open()
        if not special:
            guard = self._special_texts()
            if guard is not None and guard.search(text):
                out: list[int] = []
                pos = 0
                for m in guard.finditer(text):
                    out += self._tokenize(text[pos : m.start()], False)
                    out += self._tokenize(m.group()[0], False) + self.tokenize(m.group()[1:], special=False)
                    pos = m.end()
                return out + self._tokenize(text[pos:], False)
        return self._tokenize(text, special)

    def _special_texts(self) -> re.Pattern[str] | None:
        """A pattern matching the text of every control / user-defined token (built once: ~0.1 s at V=151k)."""
        if self._guard_re is False:
            mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED
            texts = {
                self.token_text(t)
                for t in range(self.n_vocab)
                if C.llama_vocab_get_attr(self._vocab, t) & mask
            }
            texts.discard("")
            ordered = sorted(texts, key=len, reverse=True)  # longest first: "<tool_call>" before "<"
            self._guard_re = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        return self._guard_re  # type: ignore[return-value]

    def _tokenize(self, text: str, special: bool) -> list[int]:
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

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """Raw bytes of one token (control tokens render as b'' unless ``special``)."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            if not 0 <= token < self.n_vocab:  # llama.cpp would throw (and abort the process)
                raise ValueError(f"token id {token} out of range [0, {self.n_vocab})")
            self._check_open()
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            piece = buf.raw[: max(n, 0)]
            self._pieces[key] = piece
        return piece

    def first_tokens(self, text: str) -> list[int]:
        """The tokens a fresh session's first ``append_text(text)`` evaluates (BOS when the model wants one)."""
        toks = self.tokenize(text, special=True)
        if self.add_bos and (not toks or toks[0] != self.bos):
            toks = [self.bos, *toks]
        return toks

    def token_data(self) -> np.ndarray:
        """A (V,) llama_token_data record array with ids filled (reused: one per model, one user at a time)."""
        if self._tdata is None:
            from edge_agent.runtime.sampling import TOKEN_DATA

            self._tdata = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
            self._tdata["id"] = np.arange(self.n_vocab, dtype=np.int32)
        return self._tdata

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(int(t), special=special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(C.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        """The vocabulary's text of a token (for special tokens: its literal, e.g. '<|im_end|>')."""
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token} out of range [0, {self.n_vocab})")
        t = C.llama_vocab_get_text(self._vocab, token)
        return t.decode("utf-8", "replace") if t else ""

    # ------------------------------------------------------------------------------ sessions
    def session(self) -> Session:
        """A fresh, empty session (clears this model's KV cache; the previous session is retired)."""
        from edge_agent.runtime.session import Session

        self._check_open()
        with self.lock:
            C.llama_memory_clear(C.llama_get_memory(self._ctx), True)
            s = Session(self)
            self.active_session = s
            return s

    def restore(self, state: SessionState) -> Session:
        """A new session holding ``state`` (saved by ``Session.save_state`` from a model of the same
        identity). Raises ``StateError`` when it does not fit; the KV cache is then empty."""
        from edge_agent.runtime.state import StateError

        with self.lock:
            s = self.session()
            try:
                s._restore(state)
            except StateError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure here means: evaluate instead
                C.llama_memory_clear(C.llama_get_memory(self._ctx), True)
                raise StateError(f"restoring failed ({e})") from e
            return s

    def encode_image(self, image: bytes) -> bool:
        """Encode ``image`` (PNG/JPEG bytes) with the vision projector into the shared embedding cache
        (``runtime.vision``), touching no context: a later ``append_image`` of the same bytes, on this
        model or one with the same mmproj, decodes the embedding without encoding. True when it was
        encoded now, False when the cache had it. Raises ImageError / ModelFileError like append_image."""
        from edge_agent.runtime import vision
        from edge_agent.runtime.state import image_digest

        with self.lock:
            self._check_open()
            if not self._mtmd:
                raise ModelFileError(f"{self.path.name} was loaded without a vision projector, so it cannot read "
                                     "images.", title="No vision")
            with vision.prepare(self, bytes(image)) as prep:
                for part in prep.parts:
                    if isinstance(part, vision.ImagePart):
                        return not vision.embedding(self, part.chunk, image_digest(bytes(image)))[1]
        return False

    def share_cores(self, cores: CoreShare | None, role: str = FOREGROUND, *, n_threads: int = 0) -> None:
        """Compute within ``cores`` from now on, as the ``role`` (``runtime.cores``); None: alone.
        ``n_threads`` > 0: token-by-token decoding uses that many threads from now on (so that the
        other model fits beside it)."""
        if role not in (FOREGROUND, BACKGROUND):
            raise ValueError(f"role must be {FOREGROUND!r} or {BACKGROUND!r}")
        self.cores, self.role = cores, role
        if n_threads > 0:
            self.n_threads = n_threads
        self._use_threads(self.n_threads, self.n_threads_batch)

    def _use_threads(self, n: int, n_batch: int) -> None:
        if self._ctx and (n, n_batch) != self._threads_now:
            C.llama_set_n_threads(self._ctx, n, n_batch)
            self._threads_now = (n, n_batch)

    @contextlib.contextmanager
    def computing(self, n_tokens: int, *, encode: bool = False) -> Iterator[Step | None]:
        """Around every llama_decode of ``n_tokens`` tokens and every image encode on this model.

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
        want = self.n_threads if n_tokens == 1 and not encode else self.n_threads_batch
        if self.role == BACKGROUND:
            flag = self.abort
            with share.background(want, stop=flag.is_set if flag is not None else None,
                                  preempt=flag.set if flag is not None and flag.available and not encode else None) as step:
                yield step
            if step.preempted and flag is not None and not flag.cancel_requested() and not self.interrupted:
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
        if step is None or not step.preempted or flag is None or flag.cancel_requested() or self.interrupted:
            return False
        flag.clear()
        return True

    def interrupt(self) -> None:
        """Abort the llama_decode running now (from any thread): the call raises ``Cancelled``.

        Sessions clear the flag when their next call starts, so an interrupt that arrives while nothing
        is decoding is dropped. Image encoding inside the vision projector is not interruptible.
        """
        self.interrupted = True
        if self.abort is not None:
            self.abort.set()

    # ------------------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._model is None

    def _check_open(self) -> None:
        if self._model is None:
            raise ModelRuntimeError("This model was closed. Load it again.")

    def close(self) -> None:
        """Free the mtmd context, the llama context and the model (idempotent)."""
        with self.lock:
            self.active_session = None
            if self._mtmd:
                M.mtmd_free(self._mtmd)
            self._mtmd = None
            if self._ctx:
                C.llama_free(self._ctx)
            self._ctx = None
            if self._model:
                C.llama_model_free(self._model)
            self._model = None
            self._batch = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten close() must not leak the model for the process' life
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: modules may be gone
            pass

    def __repr__(self) -> str:
        return f"Model({self.path.name!r}, n_ctx={self.n_ctx}, vision={self.has_vision})"


def file_identity(path: Path, sample: int = 1 << 20) -> str:
    """A cheap identity of a (multi-GB) model file: SHA-256 of its size, first and last MiB (~2 ms).

    Same path, size and date are not enough (a re-download keeps them; a copy changes the path);
    hashing the whole file costs seconds. A GGUF's header (metadata, tensor table) and its last
    tensor's bytes differ between any two real model files.
    """
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(sample))
        if size > sample:
            f.seek(max(sample, size - sample))
            h.update(f.read(sample))
    return h.hexdigest()[:32]


def _meta_int(model: Any, key: str) -> int:
    buf = ctypes.create_string_buffer(64)
    n = C.llama_model_meta_val_str(model, key.encode(), buf, 64)
    if n < 0:
        return 0
    try:
        return int(buf.value.decode())
    except ValueError:
        return 0


def _validate_files(path: Path, mmproj: Path | None) -> tuple[Any, Any]:
    """Check the files in Python with ``edge_agent.modelfile`` (llama.cpp aborts the process on several
    bad inputs: a wrong-width mmproj, too many deepstack layers, ...). Returns (text info, mmproj info)."""
    from edge_agent import modelfile

    text = modelfile.validate_text_model(path, need_vision=mmproj is not None)
    if mmproj is None:
        return text, None
    mm = modelfile.inspect(mmproj)
    modelfile.check_pair(text, mm)
    return text, mm


if TYPE_CHECKING:  # mypy holds the seam: the real classes implement the protocols the agent uses
    from edge_agent.runtime.types import ModelLike, SessionLike

    def _conforms(m: Model, s: Session) -> tuple[ModelLike, SessionLike]:
        return m, s
