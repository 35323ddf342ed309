"""Fake models and sessions for pure agent logic (the real runtime has its own tests): characters are tokens.

- ``LoopSession`` / ``LoopModel``: the turn loop's session (scripted generations, scores from a
  function) and a model handing it out, for ``tests/test_agent_logic.py`` (the engine too).
- ``ProphetModel`` / ``PairSession``: a prophet that "generates" a script and an agent session whose
  per-token scores favour letters, for SeProD's drafter logic (``tests/test_seprod.py``);
  ``SlowModel`` / ``SlowSession``: the same, a given time per drafted token.
Each implements its ``runtime.types`` protocol fully (``ChatSessionLike`` / ``ModelLike``,
``SessionLike`` / ``DraftModelLike``); mypy checks them (pyproject's [tool.mypy] files, and
:func:`_conforms` below).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.runtime.cores import CoreShare
from edge_agent.runtime.types import (
    ChatSessionLike,
    Checkpoint,
    ContinuationScore,
    DraftModelLike,
    Generation,
    ImageChunk,
    ModelLike,
    SessionLike,
    SessionState,
    TokenCallback,
    UntilFn,
)

EOS = "\u2403"  # the fake's end-of-generation token
V = 0x110000  # code points

ScoreFn = Callable[[str, int], float]
Output = str | Callable[["LoopSession", str | None], str]


class LoopSession:
    """Characters are tokens. Scores come from ``score_fn(text, n_calls)``; ``generate`` replays
    ``outputs`` (strings, or callables (session, grammar) -> string; a trailing EOS char is an
    end-of-generation token). Like the runtime, every generated token stays in the context (stop
    strings and EOS included), the returned text is cut before a stop string, and the last sampled
    token is pending until the next append."""

    max_candidates = 8

    def __init__(self, score_fn: ScoreFn | None = None, outputs: Sequence[Output] = (),
                 logprob: Sequence[float] = ()) -> None:
        self.log: list[tuple[str, str, bool]] = []
        self.n_pos = 0
        self.n_cells = 0
        self.n_evaluated = 0
        self.pending = 0
        self.kept: list[str] = []
        self.images: list[ImageChunk] = []
        self.score_fn: ScoreFn = score_fn or (lambda text, n: -len(text))
        self.outputs = list(outputs)
        self.logprob = list(logprob)  # per generate call: the log-prob of each of its tokens (default 0)
        self.n_score = 0
        self.scored: list[list[str | Sequence[int]]] = []
        self.grammars: list[str | None] = []
        self.stops: list[tuple[str, ...]] = []
        # the text each evaluating call evaluated, text that waited (defer) included: the runtime's
        # llama_decode calls, roughly ("<IMG>" an image; an adopt counts: the fake has no KV to adopt)
        self.evaluations: list[str] = []
        self._waiting = ""

    def _evaluate_waiting(self) -> None:
        if self._waiting:
            self.evaluations.append(self._waiting)
            self._waiting = ""

    @property
    def text(self) -> str:
        return "".join(t for kind, t, _ in self.log)

    @property
    def history(self) -> list[int]:
        """The text as code points (an image is its "<IMG>" text here, as ``checkpoint`` counts it)."""
        return [ord(c) for c in self.text]

    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None,
                    defer: bool = False) -> int:
        self.log.append(("text", text, special))
        self.n_pos += len(text)
        if defer:
            self.pending += len(text)
            self._waiting += text
            return len(text)
        self._waiting += text
        self._evaluate_waiting()
        self.n_cells += len(text) + self.pending
        self.n_evaluated += len(text) + self.pending
        self.pending = 0
        return len(text)

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None,
                      defer: bool = False) -> int:
        return self.append_text("".join(chr(t) for t in tokens), special=False, defer=defer)

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        self._evaluate_waiting()
        self.evaluations.append("<IMG>")
        self.log.append(("image", "<IMG>", True))
        self.n_pos += 7
        self.n_cells += 49 + self.pending
        self.n_evaluated += 49 + self.pending
        self.pending = 0
        chunk = ImageChunk(n_tokens=49, n_pos=7, nx=7, ny=7, width=224, height=224,
                           digest=hashlib.sha256(image).hexdigest())
        self.images.append(chunk)
        return chunk

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def drop_last_token(self) -> bool:
        if not self.pending:
            return False
        kind, t, sp = self.log.pop()
        if t[:-1]:
            self.log.append((kind, t[:-1], sp))
        self.n_pos -= 1
        self.pending = 0
        return True

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        text = self.kept[index] if n_tokens is None else self.kept[index][:n_tokens]
        self.kept = []
        return self.append_text(text, special=False)

    def key(self) -> str:
        """The content's key: the text and its images (as the runtime's: same content, same key)."""
        return hashlib.sha256(self.text.encode() + b"".join(i.digest.encode()
                                                            for i in self.images)).hexdigest()

    def save_state(self, label: str = "") -> SessionState:
        """A state with the counters and the text as code points (no KV: nothing to restore it into)."""
        history = [ord(c) for c in self.text]
        return SessionState(identity={}, key=self.key(), history=history, images=list(self.images),
                            n_pos=self.n_pos,
                            n_cells=self.n_cells, logits=np.zeros(1, np.float32), kv=np.zeros(0, np.uint8),
                            label=label)

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.n_cells, self.n_pos, len(self.text), n_pending=self.pending,
                          n_images=len(self.images))

    def rollback(self, cp: Checkpoint) -> None:
        drop = len(self.text) - cp.n_history
        self._waiting = self._waiting[: max(0, len(self._waiting) - drop)]
        while drop > 0:
            kind, t, sp = self.log.pop()
            keep = t[: max(0, len(t) - drop)]
            drop -= len(t) - len(keep)
            if keep:
                self.log.append((kind, keep, sp))
        del self.images[cp.n_images:]
        self.n_pos, self.n_cells, self.pending = cp.n_pos, cp.n_cells, cp.n_pending

    def next_logprobs(self) -> np.ndarray:
        """The loop never asks for the next-token distribution (SeProD's verify does: PairSession)."""
        raise AssertionError("the turn loop does not read next-token log-probs")

    def score(self, candidates: Sequence[str | Sequence[int]], *, special: bool = False, keep: bool = False,
              cancel: threading.Event | None = None) -> list[ContinuationScore]:
        self._evaluate_waiting()
        texts = [c if isinstance(c, str) else "".join(chr(t) for t in c) for c in candidates]
        self.kept = texts if keep else []
        self.n_score += 1
        self.scored.append(list(candidates))
        out = []
        for c in texts:
            m = float(self.score_fn(c, self.n_score))
            toks = [ord(ch) for ch in c]
            out.append(ContinuationScore(toks, np.full(len(toks), m), np.zeros(len(toks), np.int64),
                                         m * len(toks), m, len(toks)))
        return out

    def generate(self, *, max_tokens: int, stop: Sequence[str] = (), temperature: float = 0.0, seed: int = 0,
                 grammar: str | None = None, on_token: TokenCallback | None = None,
                 cancel: threading.Event | None = None, until: UntilFn | None = None) -> Generation:
        self.grammars.append(grammar)
        self.stops.append(tuple(stop))
        self._evaluate_waiting()  # its own decode, before the first token is sampled
        first = self.outputs.pop(0)
        out = first(self, grammar) if callable(first) else first
        text, reason, kept = out, "length", out
        if out.endswith(EOS):
            text, reason = out[:-1], "eos"
        hits = [(out.index(s), s) for s in stop if s in out]
        if hits:
            i, s = min(hits)
            text, reason, kept = out[:i], "stop", out[: i + len(s)]
        lp = self.logprob.pop(0) if self.logprob else 0.0  # what the model "thought" of each token, per call
        for k, ch in enumerate(kept):
            if cancel is not None and cancel.is_set():
                return Generation(text="", tokens=[], stop_reason="cancelled")
            if on_token:  # as the runtime: the pieces concatenate to the text before the stop
                on_token(ch if k < len(text) else "", ord(ch))
            if until is not None and k + 1 < min(len(kept), max_tokens) and until(
                    [ord(c) for c in kept[:k + 1]], [lp] * (k + 1)):
                kept, text, reason = kept[:k + 1], kept[:k + 1], "until"
                break
        self.append_text(kept, special=True)
        self.pending = 1
        return Generation(text=text, tokens=[ord(c) for c in kept], stop_reason=reason,
                          logprobs=[lp] * len(kept))


class LoopModel:
    """A model whose sessions are :class:`LoopSession` (made by ``make``): what the engine needs of one.
    No KV cache to save or restore (``restore`` refuses), no vision unless ``has_vision``."""

    n_ctx = 4096
    n_vocab = V
    n_threads = 1
    image_px_per_token = 32

    def __init__(self, make: Callable[[], LoopSession], *, has_vision: bool = False) -> None:
        from edge_agent.runtime.chat_template import template_of

        self.chat_template = template_of("", "", EOS)  # plain ChatML
        self.make = make
        self.has_vision = has_vision
        self.path = Path("fake.gguf")
        self.mmproj_path: Path | None = None
        self.identity: dict[str, Any] = {"model": "fake"}
        self.memory_bytes: dict[str, int] = {}
        self.sessions: list[LoopSession] = []
        self.closed = False

    def first_tokens(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return "".join(chr(t) for t in tokens)

    def session(self) -> LoopSession:
        s = self.make()
        self.sessions.append(s)
        return s

    def restore(self, state: SessionState) -> LoopSession:
        from edge_agent.runtime.types import StateError

        raise StateError("a fake session holds no KV cache to restore")

    def encode_image(self, image: bytes) -> bool:
        return False

    def share_cores(self, cores: CoreShare | None, role: str = "foreground", *, n_threads: int = 0) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class ProphetModel:
    """Tokens are code points; ``script`` is what the prophet 'generates' greedily."""

    has_vision = True
    n_ctx = 4096

    def __init__(self, script: str = "", logprob: float = -0.1) -> None:
        self.n_vocab = V
        self.script = script
        self.logprob = logprob
        self.sessions: list[PairSession] = []

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return "".join(chr(t) for t in tokens)

    def new_session(self) -> PairSession:
        return PairSession(self)

    def session(self) -> PairSession:
        s = self.new_session()
        self.sessions.append(s)
        return s

    def close(self) -> None:
        pass


class PairSession:
    """The prophet's session (it generates the script) and the agent's in SeProD tests (its scores
    favour letters; ``prefer``: the agent's next greedy tokens, else "x")."""

    max_candidates = 7

    def __init__(self, model: ProphetModel) -> None:
        self.model = model
        self.log: list[tuple[str, object]] = []
        self.tokens: list[int] = []
        self.n_pos = 0
        self.n_cells = 0
        self.n_evaluated = 0
        self.prefer: list[int] = []
        self.kept = False
        self.candidates: list[list[int]] = []

    def _add(self, entry: tuple[str, object], toks: Sequence[int]) -> int:
        self.log.append(entry)
        self.tokens += list(toks)
        self.n_pos += len(toks)
        self.n_cells += len(toks)
        self.n_evaluated += len(toks)
        return len(toks)

    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None,
                    defer: bool = False) -> int:
        return self._add(("text" if special else "untrusted", text), [ord(c) for c in text])

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None,
                      defer: bool = False) -> int:
        return self._add(("tokens", list(tokens)), tokens)

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        self._add(("image", image), [-1])
        return ImageChunk(n_tokens=1, n_pos=1, nx=1, ny=1, width=32, height=32)

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)


    def drop_last_token(self) -> bool:
        return False

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(len(self.tokens), len(self.tokens), len(self.log))

    def next_logprobs(self) -> np.ndarray:
        # the agent's greedy next token: queued ``prefer`` tokens first, else "x" (content)
        lp = np.full(V, -30.0, dtype=np.float32)
        lp[self.prefer.pop(0) if self.prefer else ord("x")] = 0.0
        return lp

    def rollback(self, cp: Checkpoint) -> None:
        self.log.append(("rollback", cp.n_cells))
        del self.tokens[cp.n_cells:]
        self.n_pos = self.n_cells = len(self.tokens)

    def generate(self, *, max_tokens: int, stop: Sequence[str] = (), temperature: float = 0.0, seed: int = 0,
                 grammar: str | None = None, on_token: TokenCallback | None = None,
                 cancel: threading.Event | None = None, until: UntilFn | None = None) -> Generation:
        toks = [ord(c) for c in self.model.script[:max_tokens]]
        self.log.append(("generate", max_tokens))
        return Generation("".join(map(chr, toks)), toks, "length", [self.model.logprob] * len(toks))

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        """Like the runtime: the kept candidate's first n tokens join the context (logged as tokens)."""
        toks = list(self.candidates[index][:n_tokens])
        if toks:
            self._add(("tokens", toks), toks)
        return len(toks)

    def score(self, candidates: Sequence[str | Sequence[int]], *, special: bool = False, keep: bool = False,
              cancel: threading.Event | None = None) -> list[ContinuationScore]:
        self.kept = keep
        self.candidates = [[ord(ch) for ch in c] if isinstance(c, str) else list(c) for c in candidates]
        # agent's opinion: p_s = 0.5 for letters, 1e-6 for anything else; rank 0 / rank 5000
        (c,) = self.candidates
        lp = np.array([math.log(0.5) if chr(t).isalpha() else math.log(1e-6) for t in c])
        ranks = np.array([0 if chr(t).isalpha() else 5000 for t in c], dtype=np.int64)
        return [ContinuationScore(list(c), lp, ranks, float(lp.sum()), float(lp.mean()), len(c))]


class SlowSession(PairSession):
    """Drafts one token every ``model.per_token`` seconds, stopping when ``cancel`` is set."""

    model: SlowModel

    def generate(self, *, max_tokens: int, stop: Sequence[str] = (), temperature: float = 0.0, seed: int = 0,
                 grammar: str | None = None, on_token: TokenCallback | None = None,
                 cancel: threading.Event | None = None, until: UntilFn | None = None) -> Generation:
        toks: list[int] = []
        for c in self.model.script[:max_tokens]:
            if cancel is not None and cancel.is_set():
                self.log.append(("cancelled", len(toks)))
                return Generation("".join(map(chr, toks)), toks, "cancelled",
                                  [self.model.logprob] * len(toks))
            time.sleep(self.model.per_token)
            toks.append(ord(c))
            if on_token is not None:
                on_token(c, ord(c))
        self.log.append(("generate", max_tokens))
        return Generation("".join(map(chr, toks)), toks, "length", [self.model.logprob] * len(toks))


class SlowModel(ProphetModel):
    def __init__(self, script: str, per_token: float) -> None:
        super().__init__(script)
        self.per_token = per_token

    def new_session(self) -> SlowSession:
        return SlowSession(self)


def _conforms(loop: LoopSession, loop_model: LoopModel, pair: PairSession, prophet: ProphetModel
              ) -> tuple[ChatSessionLike, ModelLike, SessionLike, DraftModelLike]:
    """mypy holds the fakes to the protocols the real classes implement (never called)."""
    return loop, loop_model, pair, prophet
