"""A loaded model: its files, its tokenizer, its identity; sessions on its one context.

Knows: file validation before llama.cpp sees a file (through ``edge_agent.modelfiles.checks``), what a load
asks for (context size, sequences for batched scoring, batch size, threads, KV type, flash attention,
image-token limits) and checks it, the identity of a context (what changes its numbers: saved states
are keyed by it), memory accounting, handing out sessions. Does not know: chat formats, prompts, the
agent, or where model files come from (catalog, downloads): callers hand it paths. llama.cpp itself
is behind :class:`~edge_agent.runtime.handle.Handle` (pointers, decoding, the lock, the abort flag, the
core share); text <-> tokens is :class:`~edge_agent.runtime.tokenizer.Tokenizer`.

One context per model, owned by at most one live :class:`Session` at a time (``session()`` clears the
KV cache and retires the previous session). The context holds ``n_seq_max`` sequences in one unified
KV cache of ``n_ctx`` cells: seq 0 is the conversation, seqs 1..n_seq_max-1 are scratch for candidate
scoring. Memory: the KV cache costs ``n_ctx * n_layer * (k + v widths) * bytes(kv_type)`` whatever the
number of sequences (unified); see :attr:`Model.memory_bytes`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.core.errors import ModelFileError, ModelRuntimeError
from edge_agent.runtime.cores import FOREGROUND, CoreShare, default_threads
from edge_agent.runtime.types import ModelLike, SessionLike

if TYPE_CHECKING:
    from edge_agent.core.config import Settings
    from edge_agent.runtime.handle import Handle
    from edge_agent.runtime.session import ModelFacts, Session
    from edge_agent.runtime.state import SessionState
    from edge_agent.runtime.tokenizer import Tokenizer

# A batch larger than n_batch aborts llama.cpp (GGML_ASSERT): every decode is split to fit.
DEFAULT_N_BATCH = 512
# The app's batch (and ubatch) size: at the 2B size a 600-token prefill took the same time with 256 as
# with 512 (19.0 vs 18.8 s, the 2B stand-in on a busy 2-core VM) and touched 34 MiB less of the compute
# buffer (reserved: 160 vs 321 MiB, most of it the worst-case n_ubatch x 151,936 logits).
APP_N_BATCH = 256


class Model:
    """A text GGUF (+ optional mmproj) loaded into llama.cpp. Create with :meth:`load`."""

    def __init__(self, handle: Handle, info: Any, mmproj: Path | None = None, mmproj_info: Any = None,
                 mmproj_identity: str = "") -> None:
        """Use :meth:`load`. ``info`` / ``mmproj_info``: ``edge_agent.modelfiles.checks`` records of the
        files; ``mmproj_identity``: ``file_identity(mmproj)`` when the caller has it already."""
        from edge_agent.runtime.session import ModelFacts
        from edge_agent.runtime.tokenizer import Tokenizer

        self.handle = handle  # llama.cpp: context, vocabulary, mtmd, batch, lock, abort flag, core share
        self.tokenizer: Tokenizer = Tokenizer(handle)
        self.path: Path = handle.path
        self.mmproj_path = mmproj
        self.info = info  # edge_agent.modelfiles.checks.ModelInfo of the text model
        self.mmproj_info = mmproj_info
        self.arch: str = info.architecture
        # the context as created (fixed for the model's life)
        # n_ctx: the most cells a context may hold (it may start smaller and grow: Handle.grow)
        self.n_ctx, self.n_vocab, self.n_batch, self.n_seq_max = (handle.n_ctx_max, handle.n_vocab,
                                                                  handle.n_batch, handle.n_seq_max)
        self.n_threads_batch = handle.n_threads_batch
        self.has_vision = handle.has_vision
        self.flash_attn = handle.flash_attn  # as applied: on, off, or auto (llama.cpp decides)
        self.lock = handle.lock  # one llama.cpp call sequence at a time on this model's context
        p = handle.params
        self.kv_type = p.kv_type
        self.extra_buffers = p.extra_buffers
        self.image_px_per_token = 0  # pixels per image-token side (patch * merge; 32 for Qwen3-VL), 0 unknown
        # the mmproj file's identity: with an image and its grid, what fixes an embedding
        self.mmproj_identity = ""
        self.vision_identity = ""  # mmproj + mtmd's image limits: what fixes how an image becomes tokens
        if mmproj is not None:
            self.mmproj_identity = mmproj_identity or file_identity(mmproj)
            self.vision_identity = vision_key(self.mmproj_identity, p.image_tokens)
            if mmproj_info is not None:
                self.image_px_per_token = mmproj_info.patch_size * (mmproj_info.spatial_merge_size or 1)
        from edge_agent.runtime import _lib

        self.identity: dict[str, Any] = {  # everything that changes this context's numbers (saved states)
            "model": file_identity(self.path),
            "vision": self.vision_identity,
            "kv_type": self.kv_type,
            "flash_attn": handle.flash_attn,  # (not n_ctx: a context's size changes none of its numbers)
            "n_batch": handle.n_batch,
            "llama": _lib.library_identity(),
        }
        # the projector's weights: counted by the model that loaded them (0 here when shared)
        self.vision_shared = handle.vision_borrowed
        self._mmproj_bytes = int(mmproj.stat().st_size) if mmproj and not self.vision_shared else 0
        self._memory: dict[str, int] = {}
        self._memory = self.memory_bytes
        from edge_agent.runtime.chat_template import template_of

        tok = self.tokenizer  # the texts llama-cpp-python renders a template with ("" for none)
        self.chat_template = template_of(getattr(info, "chat_template", ""),
                                         tok.token_text(tok.bos) if tok.bos >= 0 else "",
                                         tok.token_text(tok.eos) if tok.eos >= 0 else "")
        self._facts: ModelFacts = ModelFacts(name=self.path.name, identity=self.identity,
                                             mmproj_identity=self.mmproj_identity,
                                             image_px_per_token=self.image_px_per_token)

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
        share_vision_with: Model | None = None,
        n_ctx_start: int = 0,
    ) -> Model:
        """Validate the files in Python, then load them. Raises ModelFileError / ModelRuntimeError.

        ``n_seq_max``: 1 (conversation) + the most candidates scored in one decode (more are scored in
        groups). ``n_batch``: the most tokens per llama_decode (also the physical ubatch). ``kv_type``:
        f16 (default), f32 (exact comparisons in tests), q8_0, auto (:func:`auto_kv_type`). ``flash_attn``:
        auto|on|off (auto: off on CPU-only builds, where it measured slower, and with an f32 KV cache; else
        llama.cpp's choice). ``image_min_tokens`` / ``image_max_tokens``: bounds on the tokens one image
        becomes (0: the projector's defaults, 8..4096 for Qwen3-VL); a lower maximum makes big images cheaper
        on a CPU. Sampling seeds are per ``generate`` call (``Session.generate(seed=...)``). ``n_ctx`` is the
        most cells a context holds: it starts with ``n_ctx_start`` (0: kv_type auto's rule, else ``n_ctx``)
        and grows when a session needs more (``Handle.grow``: the same numbers).
        ``share_vision_with``: a loaded model whose vision projector this one uses instead of loading
        its own copy when it is the same file with the same image-token limits and this model has the
        same embedding width and vocabulary (SeProD's prophet beside the agent: 0.42 GB less at the 2B
        size); otherwise this model loads its own.
        """
        from edge_agent.runtime import _lib
        from edge_agent.runtime.handle import Handle, Params

        path = Path(path)
        mm = Path(mmproj) if mmproj else None
        if extra_buffers not in ("auto", "on", "off"):
            raise ModelRuntimeError(f"extra_buffers must be auto, on or off, not {extra_buffers!r}.")
        if kv_type not in (*_lib.KV_TYPES, "auto"):
            raise ModelRuntimeError(f"kv_type must be one of {', '.join(_lib.KV_TYPES)}, not {kv_type!r}.")
        if flash_attn not in ("auto", "on", "off"):
            raise ModelRuntimeError(f"flash_attn must be auto, on or off, not {flash_attn!r}.")
        if n_seq_max < 1 or n_ctx < 16 or n_batch < 1:
            raise ModelRuntimeError("n_seq_max must be >= 1, n_ctx >= 16 and n_batch >= 1.")
        info, mm_info = _validate_files(path, mm)
        start = n_ctx
        if kv_type == "auto":
            kv_type, start = auto_kv_type(info, n_ctx)
        start = min(n_ctx, n_ctx_start or start)
        params = Params(
            n_ctx=start, n_ctx_max=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch,
            n_threads=default_threads(n_threads, decode=True, model_bytes=info.size_bytes),
            n_threads_batch=default_threads(n_threads_batch),
            extra_buffers=_lib.extra_buffers_enabled(extra_buffers),
            kv_type=kv_type, flash_attn=flash_attn, image_tokens=(image_min_tokens, image_max_tokens),
        )
        mm_id = file_identity(mm) if mm is not None else ""
        tower = share_vision_with.handle.vision if share_vision_with is not None else None
        handle = Handle.open(path, mm, params, vision_key=vision_key(mm_id,
                                                                     params.image_tokens) if mm_id else "",
                             share_vision=tower)
        try:
            return cls(handle, info, mm, mm_info, mmproj_identity=mm_id)
        except BaseException:
            handle.close()
            raise

    @classmethod
    def from_settings(
        cls, settings: Settings, path: str | os.PathLike[str], mmproj: str | os.PathLike[str] | None = None,
        **kw: Any
    ) -> Model:
        """:meth:`load` with context size, threads and extra buffers taken from ``settings``."""
        kw.setdefault("n_ctx", settings.n_ctx)
        kw.setdefault("n_threads", settings.n_threads)
        kw.setdefault("n_threads_batch", settings.n_threads_batch)
        kw.setdefault("extra_buffers", settings.extra_buffers)
        kw.setdefault("kv_type", settings.kv_type)
        kw.setdefault("n_batch", APP_N_BATCH)
        # mtmd caps every image at the larger budget (the engine fits originals and crops to their own)
        kw.setdefault("image_max_tokens", settings.vision_max_tokens)
        return cls.load(path, mmproj, **kw)

    # ------------------------------------------------------------------------------ the context now
    @property
    def memory_bytes(self) -> dict[str, int]:
        """{"model": weights, "kv_cache": the KV cache as the context is now (it may grow), "mmproj": the
        projector's weights (0 when another model's are shared)}; after close, as it was last."""
        if not self.handle.closed:
            self._memory = {**self.handle.memory_bytes(self.arch), "mmproj": self._mmproj_bytes}
        return dict(self._memory)

    @property
    def n_threads(self) -> int:
        """Threads for token-by-token decoding (``share_cores`` may lower it)."""
        return self.handle.n_threads

    # ------------------------------------------------------------------------------ tokens
    # the vocabulary itself: :attr:`tokenizer` (pieces, end-of-generation tokens, special texts)
    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text`` (no BOS added); ``special=False`` keeps untrusted text from becoming
        special tokens (see :meth:`Tokenizer.tokenize`)."""
        return self.tokenizer.tokenize(text, special=special)

    def first_tokens(self, text: str) -> list[int]:
        """The tokens a fresh session's first ``append_text(text)`` evaluates (BOS when the model wants
        one)."""
        return self.tokenizer.first_tokens(text)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self.tokenizer.detokenize(tokens, special=special)

    # ------------------------------------------------------------------------------ sessions
    @property
    def active_session(self) -> Session | None:
        """The session that owns the context now (None after close)."""
        from edge_agent.runtime.session import Session

        owner = self.handle.owner
        return owner if isinstance(owner, Session) else None

    def session(self) -> Session:
        """A fresh, empty session (clears this model's KV cache; the previous session is retired)."""
        from edge_agent.runtime.session import Session

        return Session.open(self.handle, self.tokenizer, self._facts)

    def restore(self, state: SessionState) -> Session:
        """A new session holding ``state`` (saved by ``Session.save_state`` from a model of the same
        identity). Raises ``StateError`` when it does not fit; the KV cache is then empty."""
        from edge_agent.runtime.session import Session

        return Session.open(self.handle, self.tokenizer, self._facts, state)

    def encode_image(self, image: bytes) -> bool:
        """Encode ``image`` (PNG/JPEG bytes) with the vision projector into the shared embedding cache
        (``runtime.vision``), touching no context: a later ``append_image`` of the same bytes, on this
        model or one with the same mmproj, decodes the embedding without encoding. True when it was
        encoded now, False when the cache had it. Raises ImageError / ModelFileError like append_image."""
        from edge_agent.runtime import vision
        from edge_agent.runtime.state import image_digest

        with self.lock:
            self.handle.check_open()
            if not self.has_vision:
                raise ModelFileError(f"{self.path.name} was loaded without a vision projector, so it cannot "
                                     f"read "
                                     "images.", title="No vision")
            with vision.prepare(self.handle, bytes(image)) as prep:
                for part in prep.parts:
                    if isinstance(part, vision.ImagePart):
                        digest = image_digest(bytes(image))
                        return not vision.embedding(self.handle, part.chunk, digest, self.mmproj_identity)[1]
        return False

    @property
    def vision_encodes(self) -> int:
        """Images this model's projector encoded (reused embeddings not counted)."""
        return self.handle.vision_encodes

    def share_cores(self, cores: CoreShare | None, role: str = FOREGROUND, *, n_threads: int = 0) -> None:
        """Compute within ``cores`` from now on, as the ``role`` (``runtime.cores``); None: alone.
        ``n_threads`` > 0: token-by-token decoding uses that many threads from now on (so that the
        other model fits beside it)."""
        self.handle.share_cores(cores, role, n_threads=n_threads)

    def interrupt(self) -> None:
        """Abort the llama_decode running now (from any thread): the call raises ``Cancelled``.

        Sessions clear the flag when their next call starts, so an interrupt that arrives while nothing
        is decoding is dropped. Image encoding inside the vision projector is not interruptible.
        """
        self.handle.interrupt()

    # ------------------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self.handle.closed

    def close(self) -> None:
        """Free the mtmd context, the llama context and the model (idempotent)."""
        self.handle.close()

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


def auto_kv_type(info: Any, n_ctx: int) -> tuple[str, int]:
    """``kv_type="auto"``: (f16, the cells the context starts with): ``n_ctx``, or when an f16 cache of
    ``n_ctx`` would take more than 512 MiB, 2,048 cells (Qwen3-VL-2B: 224 MiB; a photo question with a zoom
    and its answer takes ~1,500); the context grows to ``n_ctx`` when a chat needs it (``Handle.grow``).

    Why: f16 without flash attention (a CPU build turns it off) decoded and prefilled fastest on both
    2-core machines measured (``scripts/bench_defaults.py``; the README's defaults table), while q8_0 needs
    flash attention, which the CPU kernels make slow as the context grows; and at the size we ship the
    KV cache is the largest thing after the weights (the app's peak must stay under 2.5 GB with 1.05 GB of
    weights): f16 at 2,048 cells takes 224 MiB where q8_0 took 476 at 8,192 (the peak of a photo question
    with 4,096 cells, 448 MiB, was 2,560 MiB). ``info``: the text model's ``modelfile.ModelInfo`` (header
    only). The rule is ``footprint.KvShape``'s, which the memory estimates use too."""
    from edge_agent.modelfiles import footprint

    shape = footprint.kv_shape_of_info(info)
    return shape.resolve(n_ctx, "auto"), shape.start_cells(n_ctx, "auto")


def vision_key(mmproj_identity: str, image_tokens: tuple[int, int]) -> str:
    """What fixes how an image becomes tokens and embeddings: the projector file and mtmd's (min, max)
    image-token limits (``Model.vision_identity``; two models share a vision tower only when equal)."""
    return f"{mmproj_identity}:{image_tokens[0]}:{image_tokens[1]}"


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


def _validate_files(path: Path, mmproj: Path | None) -> tuple[Any, Any]:
    """Check the files in Python with ``edge_agent.modelfiles.checks`` (llama.cpp aborts the process on
    several bad inputs: a wrong-width mmproj, too many deepstack layers, ...). Returns (text info, mmproj
    info)."""
    from edge_agent.modelfiles import checks as modelfile

    text = modelfile.validate_text_model(path, need_vision=mmproj is not None)
    if mmproj is None:
        return text, None
    mm = modelfile.inspect(mmproj)
    modelfile.check_pair(text, mm)
    return text, mm


def _conforms(m: Model, s: Session) -> tuple[ModelLike, SessionLike]:
    """mypy holds the seam: the real classes implement the protocols the agent uses (never called)."""
    return m, s
