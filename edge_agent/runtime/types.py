"""Plain values the runtime returns, and the verbs the agent depends on.

This module does not import llama_cpp: the agent, tools and UI may import it freely. The
implementation lives in the other modules of this package (the only code that imports llama_cpp).
Shapes: V = vocabulary size, T = tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from edge_agent.runtime.cores import CoreShare


@dataclass(frozen=True)
class ImageChunk:
    """An image evaluated into the context: ``n_tokens`` KV cells, ``n_pos`` positions (max(nx, ny) for
    M-RoPE)."""

    n_tokens: int
    n_pos: int
    nx: int
    ny: int
    width: int  # pixels of the image handed to the model (after any resize by mtmd)
    height: int
    digest: str = ""  # SHA-256 of the image bytes (its identity in saved-state keys)
    encode_seconds: float = 0.0  # vision encoder (0 when the embedding was reused)
    decode_seconds: float = 0.0  # evaluating the embeddings into the context
    reused: bool = False  # the embedding came from the cache (same image, same mmproj bytes)
    # the projector's marker tokens around it in the session's history (Qwen3-VL: <|vision_start|>,
    # <|vision_end|>)
    wrap_before: int = 0
    wrap_after: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """A point in a session to roll back to: cells [0, n_cells) of seq 0, and the position counter."""

    n_cells: int
    n_pos: int
    n_history: int
    n_pending: int = 0  # history tokens not yet evaluated into the KV cache at the checkpoint
    n_images: int = 0
    logits: np.ndarray | None = field(default=None, compare=False, repr=False)  # (V,) next-token logits then


@dataclass
class ContinuationScore:
    """Teacher-forced score of one candidate continuation.

    ``logprobs[j]`` = log p(tokens[j] | context, tokens[:j]); ``mean`` = sum / count (length-normalised).
    ``ranks[j]`` = how many vocabulary entries the model ranked strictly above tokens[j] (0 = argmax).
    """

    tokens: list[int]
    logprobs: np.ndarray  # (T,) float64
    ranks: np.ndarray  # (T,) int64
    sum: float
    mean: float
    count: int


@dataclass
class Generation:
    """What one ``generate`` call appended to the session."""

    text: str
    tokens: list[int]
    stop_reason: str  # "stop" (a stop string), "eos", "length", "cancelled", "until" (generate's until)
    # log p of each sampled token under the model (before grammar/temperature)
    logprobs: list[float] = field(default_factory=list)
    n_eval: int = 0  # tokens evaluated into the KV cache by this call
    seconds: float = 0.0


@dataclass
class SessionState:
    """Everything needed to continue a session in a fresh context of the same model."""

    identity: dict[str, Any]
    key: str
    history: list[int]
    images: list[ImageChunk]
    n_pos: int
    n_cells: int
    logits: np.ndarray  # (V,) float32 next-token logits
    kv: np.ndarray  # (bytes,) uint8 from llama_state_seq_get_data(seq 0)
    label: str = ""  # what it is, for people: "system prompt", "chat"
    extra: dict[str, Any] = field(default_factory=dict)  # the caller's notes (JSON values)

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes + self.logits.nbytes + 4 * len(self.history))


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template (jinja2, as its GGUF's ``tokenizer.chat_template``) and the BOS / EOS token
    texts it is rendered with (``runtime.chat_template.render``)."""

    template: str
    bos: str = ""
    eos: str = ""
    source: str = "gguf"  # gguf: the file's own; chatml: the file has none, plain ChatML is used


class StateError(Exception):
    """A state file that cannot be used (the caller evaluates instead)."""


TokenCallback = Callable[[str, int], None]  # (text piece, token id)
# (tokens so far, their log-probs) -> True to end a generation there (Generating.generate's ``until``)
UntilFn = Callable[[Sequence[int], Sequence[float]], bool]


class SessionLike(Protocol):
    """What the turn loop and SeProD use of a session: ``edge_agent.runtime.Session`` implements it on
    llama.cpp (and :class:`ChatSessionLike`, what chat persistence needs besides).

    Every verb that evaluates takes ``cancel`` (a set event aborts a running decode: ``Cancelled``);
    ``Model.interrupt()`` does the same from any thread.
    """

    @property
    def n_pos(self) -> int:
        """The position counter (text: +1 a token; image: +max(nx, ny))."""
        ...

    @property
    def n_cells(self) -> int:
        """KV cells used by seq 0."""
        ...

    @property
    def n_evaluated(self) -> int:
        """Tokens (text + image embeddings) decoded into seq 0 so far."""
        ...

    @property
    def max_candidates(self) -> int:
        """Most candidates ``score(keep=True)`` takes (n_seq_max - 1)."""
        ...

    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None,
                    defer: bool = False) -> int:
        """Tokenize and evaluate ``text``; ``special=False`` for untrusted text. Returns tokens added.
        ``defer``: pending, evaluated with the next call that evaluates anything (one decode, not two)."""
        ...

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None,
                      defer: bool = False) -> int: ...

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        """Evaluate one image (PNG/JPEG bytes) through the mmproj, wrapped in vision start/end tokens."""
        ...

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text`` as ``append_text`` would evaluate them (no BOS)."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def checkpoint(self) -> Checkpoint: ...

    def rollback(self, cp: Checkpoint) -> None: ...

    def drop_last_token(self) -> bool:
        """Take back the last generated token while it is still pending (never decoded); False if none."""
        ...

    def next_logprobs(self) -> np.ndarray:
        """(V,) log-softmax of the model's distribution for the next token."""
        ...

    def score(
        self,
        candidates: Sequence[str | Sequence[int]],
        *,
        special: bool = False,
        keep: bool = False,
        cancel: threading.Event | None = None,
    ) -> list[ContinuationScore]:
        """Score all candidates after the current context in ONE llama_decode (shared prefixes once).
        ``keep=True`` (at most ``max_candidates``) keeps their KV cells for ``adopt``."""
        ...

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        """Paste the first ``n_tokens`` of candidate ``index`` of the last ``score(keep=True)`` without
        evaluating it again (the state equals ``append_tokens`` of the same tokens)."""
        ...

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
    ) -> Generation: ...


class ChatSessionLike(SessionLike, Protocol):
    """A session as chat persistence (``edge_agent.chat.continuity``) uses it: besides the loop's verbs,
    which images it holds, the key of its content, and a saved state of it."""

    @property
    def images(self) -> Sequence[ImageChunk]:
        """The images in the context, in order (their digests: which images it holds)."""
        ...

    @property
    def history(self) -> Sequence[int]:
        """Every token of the context in order (a pending one too); an image is one ``-1`` entry (its
        chunk is the next one of ``images``): what a prompt is matched against to keep a common prefix."""
        ...

    def key(self) -> str:
        """The key of the content (model identity + exact token and image sequence): saved states."""
        ...

    def save_state(self, label: str = "") -> SessionState:
        """Snapshot seq 0 for ``ChatModelLike.restore`` (pending tokens are evaluated first)."""
        ...


class DraftModelLike(Protocol):
    """What SeProD's drafter (``edge_agent.agent.seprod``) uses of the prophet model."""

    def session(self) -> SessionLike:
        """A fresh, empty session (clears the model's KV cache: one live session per model)."""
        ...

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """The text of ``tokens`` (``special``: control tokens rendered as their text too)."""
        ...


class ChatModelLike(Protocol):
    """What chat persistence (``edge_agent.chat.continuity``) uses of the agent model."""

    n_ctx: int
    identity: dict[str, Any]  # what changes this context's numbers (keys of saved states)

    def first_tokens(self, text: str) -> list[int]:
        """The tokens a fresh session's first ``append_text(text)`` evaluates (BOS included when the
        model wants one): what a saved state of that text is keyed by."""
        ...

    def session(self) -> ChatSessionLike:
        """A fresh, empty session (clears this model's KV cache: one live session per model)."""
        ...

    def restore(self, state: SessionState) -> ChatSessionLike:
        """A new session holding a saved state (raises ``StateError`` if it does not fit)."""
        ...


class ModelLike(ChatModelLike, DraftModelLike, Protocol):
    """A loaded model (text GGUF + optional mmproj) as the engine, the composition root, uses it:
    what chat persistence and SeProD use, and the members only the engine needs (threads, memory,
    image geometry, sharing the cores, closing). ``edge_agent.runtime.Model`` implements it.

    ``Model.load(path, mmproj=None, *, n_ctx=8192, n_threads=0, n_threads_batch=0, n_seq_max=8, ...)``
    validates the files in Python first (edge_agent.modelfiles.checks) and raises ModelFileError instead of
    letting llama.cpp abort the process.
    """

    has_vision: bool
    n_vocab: int
    path: Path  # the text GGUF
    mmproj_path: Path | None  # its vision projector, None without one
    image_px_per_token: int  # pixels per image-token side (32 for Qwen3-VL), 0 unknown
    # the file's own (plain ChatML when it has none): the ``direct`` mode's prompt
    chat_template: ChatTemplate

    @property
    def memory_bytes(self) -> dict[str, int]:
        """{"model": weights, "kv_cache": as the context is now (it may grow), "mmproj": file size (0: tower
        shared)}"""
        ...

    @property
    def n_threads(self) -> int:
        """Threads for token-by-token decoding (``share_cores`` may lower it)."""
        ...

    def session(self) -> ChatSessionLike: ...

    def encode_image(self, image: bytes) -> bool:
        """Encode an image into the shared embedding cache ahead of its ``append_image`` (True: encoded
        now, False: it was cached)."""
        ...

    def share_cores(self, cores: CoreShare | None, role: str = ..., *, n_threads: int = 0) -> None:
        """Compute within ``cores`` beside another model, as "foreground" or "background"
        (``runtime.cores``)."""
        ...

    def close(self) -> None: ...
