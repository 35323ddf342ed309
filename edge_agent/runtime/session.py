"""A conversation in one llama.cpp context: seq 0 of the KV cache, its tokens and its position counter.

Knows: evaluating new text/image input exactly once, positions (text +1 a token, an image
+max(nx, ny) under M-RoPE), checkpoints, batched teacher-forced scoring of candidate continuations
in seqs 1..K (one llama_decode, shared prefixes once), adopting a scored candidate without
re-evaluating it, and sampling with stop strings, a GBNF grammar and cancellation. Does not know
chat formats, prompts, rationales or tools: callers hand it text, token ids and image bytes.

State (all kept by us, never re-derived from llama.cpp):
- ``history``: every token of the conversation (an image is one ``IMAGE`` placeholder entry).
- ``_pending``: a tail of ``history`` not in the KV cache yet. ``generate`` leaves its last sampled
  token pending (decoding it would only produce logits nobody may need) and ``adopt`` may leave one;
  any later call that needs logits or appends evaluates them first, in the same batch as new input.
- ``n_pos``: the position counter, pending tokens included; ``n_cells``: KV cells of seq 0 (pending
  excluded). After images ``n_pos < n_cells`` is normal (an image of nx*ny cells takes max(nx, ny)
  positions).
- ``_logits``: (V,) float32 copy of the next-token logits, valid when nothing is pending. Copied right
  after each decode because the next decode overwrites llama.cpp's buffer.

Thread safety: every public method holds the handle's lock, so two threads never interleave llama.cpp
calls; one session is meant to be driven by one thread (the TUI's worker). ``cancel`` events may be set
from any thread: ``generate`` checks them per token, and every call that takes one also aborts a running
llama_decode through the handle's C-level abort flag (``Model.interrupt()`` does the same).

Layers: a session reaches llama.cpp only through its :class:`~edge_agent.runtime.handle.Handle`, text
through the model's :class:`~edge_agent.runtime.tokenizer.Tokenizer`; it does not import ``model``
(``Model.session()`` / ``Model.restore()`` call :meth:`Session.open` with what the model knows).
Batched scoring (``batch``), sampling (``sampling``) and verified forced text (``forced``) return
values that the session applies; sampling a generation token by token is in ``generation``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.errors import ImageError, ModelFileError, ModelRuntimeError
from edge_agent.runtime import batch, vision
from edge_agent.runtime import state as state_mod
from edge_agent.runtime._lib import recent_errors
from edge_agent.runtime.generation import Generating
from edge_agent.runtime.handle import ContextFull, Handle
from edge_agent.runtime.scoring import row_logsumexp
from edge_agent.runtime.tokenizer import Tokenizer
from edge_agent.runtime.types import Checkpoint, ContinuationScore, ImageChunk

IMAGE = state_mod.IMAGE  # history placeholder for one image


@dataclass(frozen=True)
class ModelFacts:
    """What a session knows of its model beyond the handle and the tokenizer (``Model`` makes it)."""

    name: str  # the text GGUF's file name (for messages)
    identity: dict[str, Any]  # everything that changes the context's numbers (saved-state keys)
    mmproj_identity: str = ""  # the projector file's identity (embedding cache keys)
    image_px_per_token: int = 0  # pixels per image-token side (32 for Qwen3-VL), 0 unknown


class Session(Generating):
    """Seq 0 of a model's KV cache. Get one from ``Model.session()`` or ``Model.restore()``.
    ``generate`` and its steps are in :class:`~edge_agent.runtime.generation.Generating`."""

    defer_appends = True  # append_*(defer=True) waits for the next evaluation (False: evaluated at once)

    def __init__(self, handle: Handle, tokenizer: Tokenizer, facts: ModelFacts) -> None:  # use open()
        self._h = handle
        self._tok = tokenizer
        self._facts = facts
        self.history: list[int] = []
        self.images: list[ImageChunk] = []
        self._pending: list[int] = []
        self.n_pos = 0
        self.n_cells = 0
        self.n_evaluated = 0  # tokens (text + image embeddings) decoded into seq 0 by this session
        self.n_scored = 0  # candidate tokens decoded by score()
        self._decodes0 = handle.decodes
        self._logits: np.ndarray | None = None
        self._kept: batch.Kept | None = None
        self._scratch: np.ndarray | None = None
        self.last_timing: dict[str, float] = {}  # seconds of the last score(): decode / post (numpy)

    @classmethod
    def open(cls, handle: Handle, tokenizer: Tokenizer, facts: ModelFacts,
             state: state_mod.SessionState | None = None) -> Session:
        """A new session owning the handle's context (its KV cache cleared; an earlier session is
        retired), holding ``state`` when given (saved by :meth:`save_state` from a model of the same
        identity). Raises ``StateError`` when the state does not fit; the KV cache is then empty."""
        with handle.lock:
            s = cls(handle, tokenizer, facts)
            handle.claim(s)
            if state is not None:
                try:
                    s._load_state(state)
                except state_mod.StateError:
                    raise
                except Exception as e:  # noqa: BLE001 - any failure here means: evaluate instead
                    handle.clear_memory()
                    raise state_mod.StateError(f"restoring failed ({e})") from e
            return s

    # ------------------------------------------------------------------------------ helpers
    def _check(self) -> None:
        self._h.check_open("The model of this session was closed. Load it again.")
        if self._h.owner is not self:
            raise ModelRuntimeError("This session was replaced: Model.session() started a new one and "
                                    "cleared the KV cache.")

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    @property
    def n_decodes(self) -> int:
        """llama_decode calls on the context since this session began (an image chunk counts as one)."""
        return self._h.decodes - self._decodes0

    @property
    def max_candidates(self) -> int:
        """Most candidates one ``score(keep=True)`` takes (seqs 1..n_seq_max-1)."""
        return self._h.n_seq_max - 1

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text`` as ``append_text`` evaluates them (no BOS)."""
        return self._tok.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._tok.detokenize(tokens)

    def drop_last_token(self) -> bool:
        """Take back the last generated token while it is still pending (``generate`` leaves its last
        token undecoded): only the history shrinks, nothing was evaluated. False when nothing is pending."""
        with self._h.lock:
            self._check()
            self._drop_kept()
            if not self._pending:
                return False
            self._pending.pop()
            self.history.pop()
            self.n_pos -= 1
            if not self._pending:
                # the logits after the remaining history are the ones of the last decode only if that
                # decode ended right there; re-evaluate the last token lazily to be exact
                self._logits = None
                self._requeue_last()
            return True

    def _requeue_last(self) -> None:
        """With nothing pending and no logits: take the last text token out of the KV cache and make it
        pending again, so the next call that needs logits evaluates it."""
        if self.history and self.history[-1] != IMAGE:
            self._h.seq_rm(0, self.n_pos - 1, -1)
            self.n_cells -= 1
            self._pending = [self.history[-1]]

    def _free_cells(self, need: int = 0) -> int:
        """KV cells left; with ``need``: after growing the context when fewer are left (``Handle.grow``)."""
        if need > self._h.n_ctx - self.n_cells:
            self._h.grow(self.n_cells + need)
        return self._h.n_ctx - self.n_cells

    def _context_full(self, need: int) -> ModelRuntimeError:
        return ModelRuntimeError(
            f"The context is full: {self.n_cells} of {self._h.n_ctx_max} tokens used, {need} more needed. "
            "Start a new chat, or raise n_ctx in the settings.",
            title="Context full",
        )

    def _flush(self) -> int:
        """Evaluate pending tokens into seq 0 (n_batch at a time); keep the last token's logits."""
        toks = self._pending
        if not toks:
            return 0
        if len(toks) > self._free_cells(len(toks)):
            raise self._context_full(len(toks))
        b = self._h.batch
        assert b is not None
        p0 = self.n_pos - len(toks)
        done = 0
        try:
            while done < len(toks):
                m = b.fill_run(toks[done : done + b.cap], p0 + done, last_logits=done + b.cap >= len(toks))
                self._h.decode(m)
                done += m
                self.n_cells += m
                self.n_evaluated += m
        except ContextFull:
            self._h.seq_rm(0, p0, -1)  # undo the part of this flush that reached the KV cache
            self.n_cells -= done
            raise self._context_full(len(toks) - done) from None
        except BaseException:
            # Undo the part of this flush that reached the KV cache; the tokens stay pending.
            self._h.seq_rm(0, p0, -1)
            self.n_cells -= done
            raise
        self._logits = self._h.last_logits()
        self._pending = []
        return done

    def _drop_kept(self) -> None:
        if self._kept is not None:
            batch.release(self._h, self._kept)
            self._kept = None

    def _append(self, toks: list[int], *, bos: bool = True, defer: bool = False) -> int:
        """Add tokens to the history and evaluate them (with anything pending) in one pass; ``defer``:
        leave them pending for the next evaluation."""
        n_hist, n_pending = len(self.history), len(self._pending)
        if bos and not self.history:
            toks = self._tok.with_bos(toks)
        self.history.extend(toks)
        self._pending.extend(toks)
        self.n_pos += len(toks)
        if defer and self.defer_appends:
            self._logits = None  # pending tokens: the next-token logits come with their evaluation
            return len(toks)
        try:
            self._flush()
        except BaseException:
            del self.history[n_hist:]
            del self._pending[n_pending:]
            self.n_pos -= len(toks)
            raise
        return len(toks)

    # ------------------------------------------------------------------------------ input
    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None,
                    defer: bool = False) -> int:
        """Tokenize and evaluate ``text``; ``special=False`` for untrusted text (no special tokens parsed).

        Returns the number of tokens added (a BOS is prepended to the first input when the model wants one).
        ``cancel`` set during the evaluation aborts it: ``Cancelled`` is raised and nothing is appended.
        ``defer``: the tokens join the context pending, not evaluated now; the next call that evaluates
        anything (an append, ``generate``, ``score``, the logits, an image, a saved state) evaluates them in
        the same batch. On a CPU a small decode is slow per token (Qwen 1.5B, 2 cores: 9 tokens alone 300 ms;
        247 tokens in one decode 3.75 s, ~15 ms a token), so text that needs no logits of its own waits.
        """
        with self._h.lock, self._h.cancellable(cancel):
            self._check()
            self._drop_kept()
            return self._append(self._tok.tokenize(text, special=special), defer=defer)

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None,
                      defer: bool = False) -> int:
        """Evaluate token ids (no BOS handling); returns how many were added. ``cancel``, ``defer``: as
        append_text."""
        with self._h.lock, self._h.cancellable(cancel):
            self._check()
            self._drop_kept()
            toks = [int(t) for t in tokens]
            bad = [t for t in toks if not 0 <= t < self._tok.n_vocab]
            if bad:
                raise ValueError(f"token ids out of range [0, {self._tok.n_vocab}): {bad[:5]}")
            return self._append(toks, bos=False, defer=defer)

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        """Evaluate one image (PNG/JPEG bytes) through the mmproj, wrapped in
        ``<|vision_start|>...<|vision_end|>``.

        The wrapper tokens come from mtmd (it knows each projector's markers). Positions: the image
        takes max(nx, ny) positions and nx*ny KV cells (M-RoPE); the text after it continues there.
        ``cancel`` aborts the decode of the image tokens (not the projector's encoding): ``Cancelled``.
        """
        with self._h.lock, self._h.cancellable(cancel):
            self._check()
            self._drop_kept()
            if not self._h.has_vision:
                raise ModelFileError(
                    f"{self._facts.name} was loaded without a vision projector, so it cannot read images. "
                    "Pass the model's mmproj file (--mmproj) or pick a vision model.",
                    title="No vision",
                )
            if not isinstance(image, bytes | bytearray) or not image:
                raise ImageError("The image is empty. Attach a PNG or JPEG file.")
            image = bytes(image)
            cp = self._checkpoint()
            try:
                with vision.prepare(self._h, image) as prep:
                    result: ImageChunk | None = None
                    for part in prep.parts:
                        if isinstance(part, vision.ImagePart):
                            result = self._eval_image_chunk(part.chunk, prep, state_mod.image_digest(image))
                        else:  # the image's wrapper tokens: evaluated with what comes before / after
                            self._append(part, defer=True)
                    assert result is not None
                    return result
            except BaseException:
                self._rollback(cp)
                raise

    def _eval_image_chunk(self, chunk: object, prep: vision.Prepared, digest: str) -> ImageChunk:
        self._flush()
        n_tok = vision.chunk_shape(chunk)[2]
        if n_tok > self._free_cells(n_tok):
            raise self._context_full(n_tok)
        info = vision.decode_chunk(self._h, chunk, prep, digest, self.n_pos, self._facts.mmproj_identity,
                                   self._facts.image_px_per_token)
        self.history.append(IMAGE)
        self.images.append(info)
        self.n_pos += info.n_pos
        self.n_cells += n_tok
        self.n_evaluated += n_tok
        self._logits = None  # the image decode outputs no logits; the closing text token will
        return info

    # ------------------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> Checkpoint:
        return Checkpoint(
            n_cells=self.n_cells,
            n_pos=self.n_pos,
            n_history=len(self.history),
            n_pending=len(self._pending),
            n_images=len(self.images),
            logits=self._logits,  # never modified in place: safe to share
        )

    def checkpoint(self) -> Checkpoint:
        """The current point, to :meth:`rollback` to later (cheap: counters and a reference to the logits)."""
        with self._h.lock:
            self._check()
            self._drop_kept()
            return self._checkpoint()

    def _rollback(self, cp: Checkpoint) -> None:
        if cp.n_history > len(self.history) or cp.n_pos > self.n_pos:
            raise ModelRuntimeError("This checkpoint is ahead of the session (it belongs to another session "
                                    "or a rolled-back branch).")
        kv_end = cp.n_pos - cp.n_pending  # positions >= kv_end were not in the KV cache at the checkpoint
        self._h.seq_rm(0, kv_end, -1)
        del self.history[cp.n_history :]
        del self.images[cp.n_images :]
        self._pending = self.history[len(self.history) - cp.n_pending :] if cp.n_pending else []
        self.n_pos = cp.n_pos
        self.n_cells = cp.n_cells
        self._logits = cp.logits
        if not self._pending and self._logits is None:
            # A checkpoint without logits (e.g. built by hand to drop a pending token): re-evaluate
            # the last token lazily so next_logprobs/score/generate still work.
            self._requeue_last()

    def rollback(self, cp: Checkpoint) -> None:
        """Forget everything after ``cp`` (KV cells removed with llama_memory_seq_rm from its position)."""
        with self._h.lock:
            self._check()
            self._drop_kept()
            self._rollback(cp)

    # ------------------------------------------------------------------------------ saved states
    def key(self) -> str:
        """The key of this session's content (model identity + exact token and image sequence)."""
        with self._h.lock:
            return state_mod.sequence_key(self._facts.identity, self.history, self.images)

    def save_state(self, label: str = "") -> state_mod.SessionState:
        """Snapshot seq 0 (pending tokens are evaluated first): the KV bytes and everything llama.cpp
        does not keep. Costs one copy of the sequence's KV cells (a few ms per 10 MB)."""
        with self._h.lock:
            logits = self._settled_logits("Nothing to save: the context is empty or ends in an image.")
            kv = self._h.state_bytes(0)
            identity = self._facts.identity
            return state_mod.SessionState(
                identity=dict(identity), key=state_mod.sequence_key(identity, self.history, self.images),
                history=list(self.history), images=list(self.images), n_pos=self.n_pos, n_cells=self.n_cells,
                logits=logits.copy(), kv=kv, label=label,
            )

    def _load_state(self, st: state_mod.SessionState) -> None:
        """Load ``st`` into this (fresh, empty) session. Raises StateError (the context is left empty)."""
        if st.identity != self._facts.identity:
            raise state_mod.StateError("saved by another model, build or context setting")
        self._h.grow(st.n_cells)
        if st.logits.shape != (self._tok.n_vocab,) or st.n_cells > self._h.n_ctx:
            raise state_mod.StateError("does not fit this model's vocabulary or context")
        took = self._h.set_state_bytes(st.kv, 0)
        rng = self._h.seq_range(0)
        if not took or (rng[1] if rng else -1) != st.n_pos - 1:
            self._h.seq_rm(0, -1, -1)
            raise state_mod.StateError("llama.cpp did not take the state "
                                       f"({recent_errors() or 'no details'})")
        self.history = list(st.history)
        self.images = list(st.images)
        self._pending = []
        self.n_pos, self.n_cells = st.n_pos, st.n_cells
        self._logits = st.logits.copy()

    # ------------------------------------------------------------------------------ distributions
    def _settled_logits(self, empty: str) -> np.ndarray:
        """Evaluate anything pending and return the next-token logits (raises ``empty`` if there are none)."""
        self._check()
        self._drop_kept()
        self._flush()
        if self._logits is None:
            raise ModelRuntimeError(empty)
        return self._logits

    def next_logits(self) -> np.ndarray:
        """(V,) float32 raw logits for the next token (a copy)."""
        with self._h.lock:
            return self._settled_logits("Nothing has been evaluated yet: append text first.").copy()

    def next_logprobs(self) -> np.ndarray:
        """(V,) float32 log-softmax of the model's distribution for the next token."""
        logits = self.next_logits()
        lse = row_logsumexp(logits[None, :])[0]
        return (logits.astype(np.float64) - lse).astype(np.float32)

    # ------------------------------------------------------------------------------ scoring
    # (runtime/batch.py)
    def score(
        self,
        candidates: Sequence[str | Sequence[int]],
        *,
        special: bool = False,
        keep: bool = False,
        cancel: threading.Event | None = None,
    ) -> list[ContinuationScore]:
        """Teacher-forced log-probs of each candidate after the current context, in ONE llama_decode
        (shared prefixes once, leaves never evaluated; more than ``n_seq_max - 1`` candidates in groups,
        more trie nodes than ``n_batch`` in several decodes): see
        :func:`edge_agent.runtime.batch.score_group`.

        Strings are tokenized with ``special`` (default False: candidate text is plain text); token
        lists are used as given. ``keep=True`` leaves the candidates' cells for :meth:`adopt` (until the
        next call). ``cancel`` aborts the scoring decode (``Cancelled``; the candidate sequences are removed).
        """
        with self._h.lock, self._h.cancellable(cancel):
            self._check()
            self._drop_kept()
            toks = batch.candidate_tokens(self._tok, candidates, special=special)
            if not toks:
                return []
            group = batch.check_group(self._h, len(toks), keep)
            self._flush()
            if self._logits is None:
                raise ModelRuntimeError("Scoring needs a context: append text first.")
            out: list[ContinuationScore] = []
            for s in range(0, len(toks), group):
                try:
                    got = batch.score_group(self._h, toks[s : s + group], logits=self._logits,
                                            n_pos=self.n_pos,
                                            free=self._free_cells(sum(map(len, toks[s : s + group]))),
                                            keep=keep,
                                            scratch=self._scratch_for())
                except ContextFull as e:
                    raise self._context_full(e.need) from None
                self.n_scored += got.n_rows
                self.last_timing = got.timing
                self._kept = got.kept
                out.extend(got.results)
            return out

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        """Make the first ``n_tokens`` (default: all) of kept candidate ``index`` part of the conversation.

        Needs ``score(..., keep=True)`` as the previous call on this session. No token is evaluated
        again (see :func:`edge_agent.runtime.batch.adopt`); the resulting state is the one
        ``append_tokens`` of the same tokens gives. Returns the number of tokens adopted.
        """
        with self._h.lock:
            self._check()
            kept = self._kept
            if kept is None:
                raise ModelRuntimeError("adopt() needs score(..., keep=True) immediately before it.")
            try:
                got = batch.adopt(self._h, kept, index, n_tokens, self.n_pos)
                if got.tokens:
                    self._took(got.tokens, got.n_kv, got.logits)
                return len(got.tokens)
            finally:
                self._drop_kept()

    # ------------------------------------------------------------------------------ introspection
    def kv_seq_ranges(self) -> dict[int, tuple[int, int]]:
        """{seq: (min pos, max pos)} for every sequence holding cells (tests use it to find leaks)."""
        with self._h.lock:
            ranges = {s: self._h.seq_range(s) for s in range(self._h.n_seq_max)}
            return {s: rng for s, rng in ranges.items() if rng is not None}

    def text(self) -> str:
        """The conversation as text (special tokens rendered; an image as ``<image>``), for debugging."""
        return "".join("<image>" if t == IMAGE else self._tok.detokenize([t],
                                                                         special=True) for t in self.history)
