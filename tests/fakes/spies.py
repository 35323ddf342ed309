"""Spies on the real runtime: :class:`SpyModel` hands out :class:`SpySession`\\ s that pass every call to
a real ``runtime.Session`` and record the images appended (PNG bytes, the chunk, the position counter
before and after). They implement ``runtime.types.ModelLike`` / ``ChatSessionLike`` fully (mypy checks
them: pyproject's [tool.mypy] files), so the engine runs on them exactly as on the real classes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_agent.runtime import Model, Session
from edge_agent.runtime.cores import CoreShare
from edge_agent.runtime.types import (
    ChatSessionLike,
    Checkpoint,
    ContinuationScore,
    Generation,
    ImageChunk,
    ModelLike,
    SessionState,
    TokenCallback,
    UntilFn,
)


@dataclass(frozen=True)
class Appended:
    """One ``append_image`` seen by a spy."""

    png: bytes
    chunk: ImageChunk
    n_pos_before: int
    n_pos_after: int


class SpySession:
    """A real session, every call passed on; ``appended``: the images, in order."""

    def __init__(self, inner: Session, model: SpyModel) -> None:
        self.inner = inner
        self.model = model
        self.appended: list[Appended] = []

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        before = self.inner.n_pos
        chunk = self.inner.append_image(image, cancel=cancel)
        seen = Appended(bytes(image), chunk, before, self.inner.n_pos)
        self.appended.append(seen)
        self.model.appended.append(seen)
        return chunk

    # ---- the rest passes through (the counters live in the real session) -------------------------
    @property
    def n_pos(self) -> int:
        return self.inner.n_pos

    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None,
                    defer: bool = False) -> int:
        return self.inner.append_text(text, special=special, cancel=cancel, defer=defer)

    @property
    def n_cells(self) -> int:
        return self.inner.n_cells

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None,
                      defer: bool = False) -> int:
        return self.inner.append_tokens(tokens, cancel=cancel, defer=defer)

    @property
    def n_evaluated(self) -> int:
        return self.inner.n_evaluated

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self.inner.tokenize(text, special=special)

    @property
    def max_candidates(self) -> int:
        return self.inner.max_candidates

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.inner.detokenize(tokens)

    @property
    def images(self) -> Sequence[ImageChunk]:
        return self.inner.images

    @property
    def history(self) -> Sequence[int]:
        return self.inner.history

    def checkpoint(self) -> Checkpoint:
        return self.inner.checkpoint()

    def rollback(self, cp: Checkpoint) -> None:
        self.inner.rollback(cp)

    def drop_last_token(self) -> bool:
        return self.inner.drop_last_token()

    def next_logprobs(self) -> np.ndarray:
        return self.inner.next_logprobs()

    def score(self, candidates: Sequence[str | Sequence[int]], *, special: bool = False, keep: bool = False,
              cancel: threading.Event | None = None) -> list[ContinuationScore]:
        return self.inner.score(candidates, special=special, keep=keep, cancel=cancel)

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        return self.inner.adopt(index, n_tokens)

    def generate(self, *, max_tokens: int, stop: Sequence[str] = (), temperature: float = 0.0, seed: int = 0,
                 grammar: str | None = None, on_token: TokenCallback | None = None,
                 cancel: threading.Event | None = None, until: UntilFn | None = None) -> Generation:
        return self.inner.generate(max_tokens=max_tokens, stop=stop, temperature=temperature, seed=seed,
                                   grammar=grammar, on_token=on_token, cancel=cancel, until=until)

    def key(self) -> str:
        return self.inner.key()

    def save_state(self, label: str = "") -> SessionState:
        return self.inner.save_state(label)


class SpyModel:
    """A real model whose sessions (new or restored) are :class:`SpySession`\\ s; ``sessions`` in order,
    ``appended``: every image any of them appended."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.sessions: list[SpySession] = []
        self.appended: list[Appended] = []
        # fixed for the model's life: copied
        self.n_ctx, self.n_vocab, self.has_vision, self.path = (inner.n_ctx, inner.n_vocab, inner.has_vision,
                                                                inner.path)
        self.mmproj_path = inner.mmproj_path
        self.identity, self.memory_bytes = inner.identity, inner.memory_bytes
        self.image_px_per_token = inner.image_px_per_token
        self.chat_template = inner.chat_template

    def _spy(self, s: Session) -> SpySession:
        spy = SpySession(s, self)
        self.sessions.append(spy)
        return spy

    def session(self) -> SpySession:
        return self._spy(self.inner.session())

    def restore(self, state: SessionState) -> SpySession:
        return self._spy(self.inner.restore(state))

    @property
    def pngs(self) -> list[bytes]:
        return [a.png for a in self.appended]

    # ---- the rest passes through ----------------------------------------------------------------
    @property
    def n_threads(self) -> int:
        return self.inner.n_threads

    def first_tokens(self, text: str) -> list[int]:
        return self.inner.first_tokens(text)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self.inner.detokenize(tokens, special=special)

    def encode_image(self, image: bytes) -> bool:
        return self.inner.encode_image(image)

    def share_cores(self, cores: CoreShare | None, role: str = "foreground", *, n_threads: int = 0) -> None:
        self.inner.share_cores(cores, role, n_threads=n_threads)

    def close(self) -> None:
        self.inner.close()


def _conforms(m: SpyModel, s: SpySession) -> tuple[ModelLike, ChatSessionLike]:
    """mypy holds the spies to the protocols the real classes implement (never called)."""
    return m, s
