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

Thread safety: every public method holds the model's lock, so two threads never interleave llama.cpp
calls; one session is meant to be driven by one thread (the TUI's worker). ``cancel`` events may be set
from any thread: ``generate`` checks them per token, and every call that takes one also aborts a running
llama_decode through the model's C-level abort flag (``Model.interrupt()`` does the same).

Costs (SmolLM2-135M, 1 thread of a shared 2-core VM, ~600-token context): scoring the built-in six
rationales (41 tokens, 23 distinct prefixes, 17 inner trie nodes evaluated) takes the time of ~7-10
decoded tokens; see scripts/bench_runtime.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.errors import Cancelled, ImageError, ModelFileError, ModelRuntimeError
from edge_agent.runtime import batch, vision
from edge_agent.runtime import state as state_mod
from edge_agent.runtime._lib import C, clear_errors, recent_errors
from edge_agent.runtime.sampling import Sampler
from edge_agent.runtime.scoring import row_logsumexp
from edge_agent.runtime.textstream import StopStream
from edge_agent.runtime.types import Checkpoint, ContinuationScore, Generation, ImageChunk, TokenCallback

if TYPE_CHECKING:
    from edge_agent.runtime.model import Model

IMAGE = state_mod.IMAGE  # history placeholder for one image
_U8P = ctypes.POINTER(ctypes.c_uint8)


class Session:
    """Seq 0 of a model's KV cache. Get one from ``Model.session()``."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._ctx = model._ctx
        self._mem = C.llama_get_memory(self._ctx)
        self.history: list[int] = []
        self.images: list[ImageChunk] = []
        self._pending: list[int] = []
        self.n_pos = 0
        self.n_cells = 0
        self.n_evaluated = 0  # tokens (text + image embeddings) decoded into seq 0 by this session
        self.n_scored = 0  # candidate tokens decoded by score()
        self.n_decodes = 0  # llama_decode calls (image chunks count as one)
        self._logits: np.ndarray | None = None
        self._kept: batch.Kept | None = None
        self._serial = 0
        self._scratch: np.ndarray | None = None
        self.last_timing: dict[str, float] = {}  # seconds of the last score(): decode / post (numpy)

    # ------------------------------------------------------------------------------ helpers
    def _check(self) -> None:
        if self.model.closed:
            raise ModelRuntimeError("The model of this session was closed. Load it again.")
        if self.model.active_session is not self:
            raise ModelRuntimeError("This session was replaced: Model.session() started a new one and cleared the KV cache.")

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    @property
    def max_candidates(self) -> int:
        """Most candidates one ``score(keep=True)`` takes (seqs 1..n_seq_max-1)."""
        return self.model.n_seq_max - 1

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text`` as ``append_text`` evaluates them (no BOS)."""
        return self.model.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    def drop_last_token(self) -> bool:
        """Take back the last generated token while it is still pending (``generate`` leaves its last
        token undecoded): only the history shrinks, nothing was evaluated. False when nothing is pending."""
        with self.model.lock:
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
                if self.history and self.history[-1] != IMAGE:
                    C.llama_memory_seq_rm(self._mem, 0, self.n_pos - 1, -1)
                    self.n_cells -= 1
                    self._pending = [self.history[-1]]
            return True

    def _free_cells(self) -> int:
        return self.model.n_ctx - self.n_cells

    def _context_full(self, need: int) -> ModelRuntimeError:
        return ModelRuntimeError(
            f"The context is full: {self.n_cells} of {self.model.n_ctx} tokens used, {need} more needed. "
            "Start a new chat, or raise n_ctx in the settings.",
            title="Context full",
        )

    @contextlib.contextmanager
    def _cancellable(self, cancel: threading.Event | None, *, raise_if_set: bool = True) -> Iterator[None]:
        """Run a public call so that ``cancel`` (or ``Model.interrupt()``) aborts a running llama_decode.

        A watcher thread mirrors the Event into the model's C-level abort flag (llama.cpp polls it
        between graph nodes); an aborted decode raises ``Cancelled`` after its partial KV is removed.
        """
        flag = self.model.abort
        if raise_if_set and cancel is not None and cancel.is_set():
            raise Cancelled()
        self.model.interrupted = False
        if flag is not None:
            flag.clear()
        if cancel is None or flag is None or not flag.available:
            try:
                yield
            finally:
                if flag is not None:
                    flag.clear()
            return
        try:
            with flag.watching(cancel):
                yield
        finally:
            flag.clear()

    def _decode(self, n: int) -> None:
        b = self.model._batch
        assert b is not None and n <= b.cap
        b.struct.n_tokens = n
        while True:
            clear_errors()
            with self.model.computing(n) as step:
                rc = C.llama_decode(self._ctx, b.struct)
            # preempted by the foreground model: llama.cpp removed the aborted ubatch's cells; again
            if not (rc == 2 and self.model.resume_after(step)):
                break
        self._serial += 1
        self.n_decodes += 1
        if rc != 0:
            if rc == 1:
                raise self._context_full(n)
            if rc == 2:  # aborted through the abort flag: processed ubatches stay; callers remove them
                raise Cancelled()
            raise ModelRuntimeError(f"llama_decode failed with code {rc} ({recent_errors() or 'no details'}).")

    def _logits_rows(self, n_rows: int) -> np.ndarray:
        """Zero-copy (n_rows, V) float32 view of llama.cpp's logits buffer (valid until the next decode)."""
        ptr = C.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_vocab))

    def _flush(self) -> int:
        """Evaluate pending tokens into seq 0 (n_batch at a time); keep the last token's logits."""
        toks = self._pending
        if not toks:
            return 0
        if len(toks) > self._free_cells():
            raise self._context_full(len(toks))
        b = self.model._batch
        assert b is not None
        p0 = self.n_pos - len(toks)
        done = 0
        try:
            while done < len(toks):
                m = min(b.cap, len(toks) - done)
                b.tok[:m] = toks[done : done + m]
                b.pos[:m] = np.arange(p0 + done, p0 + done + m, dtype=np.int32)
                b.nseq[:m] = 1
                b.seq[:m, 0] = 0
                b.out[:m] = 0
                if done + m == len(toks):
                    b.out[m - 1] = 1
                self._decode(m)
                done += m
                self.n_cells += m
                self.n_evaluated += m
        except BaseException:
            # Undo the part of this flush that reached the KV cache; the tokens stay pending.
            C.llama_memory_seq_rm(self._mem, 0, p0, -1)
            self.n_cells -= done
            raise
        last = C.llama_get_logits_ith(self._ctx, -1)
        self._logits = np.ctypeslib.as_array(last, shape=(self.model.n_vocab,)).copy()
        self._pending = []
        return done

    def _drop_kept(self) -> None:
        if self._kept is not None:
            for k in range(len(self._kept.tokens)):
                C.llama_memory_seq_rm(self._mem, k + 1, -1, -1)
            self._kept = None

    def _append(self, toks: list[int], *, bos: bool = True) -> int:
        """Add tokens to the history and evaluate them (with anything pending) in one pass."""
        n_hist, n_pending = len(self.history), len(self._pending)
        if bos and not self.history and self.model.add_bos and (not toks or toks[0] != self.model.bos):
            toks = [self.model.bos, *toks]
        self.history.extend(toks)
        self._pending.extend(toks)
        self.n_pos += len(toks)
        try:
            self._flush()
        except BaseException:
            del self.history[n_hist:]
            del self._pending[n_pending:]
            self.n_pos -= len(toks)
            raise
        return len(toks)

    # ------------------------------------------------------------------------------ input
    def append_text(self, text: str, *, special: bool = True, cancel: threading.Event | None = None) -> int:
        """Tokenize and evaluate ``text``; ``special=False`` for untrusted text (no special tokens parsed).

        Returns the number of tokens added (a BOS is prepended to the first input when the model wants one).
        ``cancel`` set during the evaluation aborts it: ``Cancelled`` is raised and nothing is appended.
        """
        with self.model.lock, self._cancellable(cancel):
            self._check()
            self._drop_kept()
            return self._append(self.model.tokenize(text, special=special))

    def append_tokens(self, tokens: Sequence[int], *, cancel: threading.Event | None = None) -> int:
        """Evaluate token ids (no BOS handling); returns how many were added. ``cancel``: as append_text."""
        with self.model.lock, self._cancellable(cancel):
            self._check()
            self._drop_kept()
            toks = [int(t) for t in tokens]
            bad = [t for t in toks if not 0 <= t < self.model.n_vocab]
            if bad:
                raise ValueError(f"token ids out of range [0, {self.model.n_vocab}): {bad[:5]}")
            return self._append(toks, bos=False)

    def append_image(self, image: bytes, *, cancel: threading.Event | None = None) -> ImageChunk:
        """Evaluate one image (PNG/JPEG bytes) through the mmproj, wrapped in ``<|vision_start|>...<|vision_end|>``.

        The wrapper tokens come from mtmd (it knows each projector's markers). Positions: the image
        takes max(nx, ny) positions and nx*ny KV cells (M-RoPE); the text after it continues there.
        ``cancel`` aborts the decode of the image tokens (not the projector's encoding): ``Cancelled``.
        """
        with self.model.lock, self._cancellable(cancel):
            self._check()
            self._drop_kept()
            mt = self.model._mtmd
            if not mt:
                raise ModelFileError(
                    f"{self.model.path.name} was loaded without a vision projector, so it cannot read images. "
                    "Pass the model's mmproj file (--mmproj) or pick a vision model.",
                    title="No vision",
                )
            if not isinstance(image, bytes | bytearray) or not image:
                raise ImageError("The image is empty. Attach a PNG or JPEG file.")
            image = bytes(image)
            cp = self._checkpoint()
            try:
                with vision.prepare(self.model, image) as prep:
                    result: ImageChunk | None = None
                    for part in prep.parts:
                        if isinstance(part, vision.ImagePart):
                            result = self._eval_image_chunk(part.chunk, prep, state_mod.image_digest(image))
                        else:
                            self._append(part)
                    assert result is not None
                    return result
            except BaseException:
                self._rollback(cp)
                raise

    def _eval_image_chunk(self, chunk: object, prep: vision.Prepared, digest: str) -> ImageChunk:
        self._flush()
        nx, ny, n_tok, n_pos = vision.chunk_shape(chunk)
        if n_tok > self._free_cells():
            raise self._context_full(n_tok)
        emb, reused = vision.embedding(self.model, chunk, digest)
        t0 = time.perf_counter()
        self._serial += 1
        self.n_decodes += 1
        while True:
            try:
                with self.model.computing(n_tok) as step:
                    new_pos = vision.decode(self.model, chunk, emb, self.n_pos, 0)
                break
            except ModelRuntimeError:
                C.llama_memory_seq_rm(self._mem, 0, self.n_pos, -1)
                if self.model.resume_after(step):  # preempted by the foreground model: decode it again
                    continue
                if self.model.abort is not None and self.model.abort.is_set():
                    raise Cancelled() from None
                raise
        if new_pos != self.n_pos + n_pos:
            raise ModelRuntimeError(f"mtmd advanced the position by {new_pos - self.n_pos}, expected {n_pos}.")
        px = self.model.image_px_per_token
        chunk_info = ImageChunk(
            n_tokens=n_tok, n_pos=n_pos, nx=nx, ny=ny, width=nx * px if px else prep.width,
            height=ny * px if px else prep.height, digest=digest,
            encode_seconds=0.0 if reused else emb.encode_seconds, decode_seconds=time.perf_counter() - t0,
            reused=reused,
        )
        self.history.append(IMAGE)
        self.images.append(chunk_info)
        self.n_pos = new_pos
        self.n_cells += n_tok
        self.n_evaluated += n_tok
        self._logits = None  # the image decode outputs no logits; the closing text token will
        return chunk_info

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
        with self.model.lock:
            self._check()
            self._drop_kept()
            return self._checkpoint()

    def _rollback(self, cp: Checkpoint) -> None:
        if cp.n_history > len(self.history) or cp.n_pos > self.n_pos:
            raise ModelRuntimeError("This checkpoint is ahead of the session (it belongs to another session or a rolled-back branch).")
        kv_end = cp.n_pos - cp.n_pending  # positions >= kv_end were not in the KV cache at the checkpoint
        C.llama_memory_seq_rm(self._mem, 0, kv_end, -1)
        del self.history[cp.n_history :]
        del self.images[cp.n_images :]
        self._pending = self.history[len(self.history) - cp.n_pending :] if cp.n_pending else []
        self.n_pos = cp.n_pos
        self.n_cells = cp.n_cells
        self._logits = cp.logits
        if not self._pending and self._logits is None and self.history and self.history[-1] != IMAGE:
            # A checkpoint without logits (e.g. built by hand to drop a pending token): re-evaluate
            # the last token lazily so next_logprobs/score/generate still work.
            C.llama_memory_seq_rm(self._mem, 0, self.n_pos - 1, -1)
            self.n_cells -= 1
            self._pending = [self.history[-1]]

    def rollback(self, cp: Checkpoint) -> None:
        """Forget everything after ``cp`` (KV cells removed with llama_memory_seq_rm from its position)."""
        with self.model.lock:
            self._check()
            self._drop_kept()
            self._rollback(cp)

    # ------------------------------------------------------------------------------ saved states
    def key(self) -> str:
        """The key of this session's content (model identity + exact token and image sequence)."""
        with self.model.lock:
            return state_mod.sequence_key(self.model.identity, self.history, self.images)

    def save_state(self, label: str = "") -> state_mod.SessionState:
        """Snapshot seq 0 (pending tokens are evaluated first): the KV bytes and everything llama.cpp
        does not keep. Costs one copy of the sequence's KV cells (a few ms per 10 MB)."""
        with self.model.lock:
            logits = self._settled_logits("Nothing to save: the context is empty or ends in an image.")
            size = int(C.llama_state_seq_get_size(self._ctx, 0))
            kv = np.empty(size, dtype=np.uint8)
            got = int(C.llama_state_seq_get_data(self._ctx, kv.ctypes.data_as(_U8P), size, 0))
            if got != size:
                raise ModelRuntimeError(f"llama.cpp copied {got} of {size} bytes of the context state.")
            return state_mod.SessionState(
                identity=dict(self.model.identity), key=state_mod.sequence_key(self.model.identity, self.history, self.images),
                history=list(self.history), images=list(self.images), n_pos=self.n_pos, n_cells=self.n_cells,
                logits=logits.copy(), kv=kv, label=label,
            )

    def _restore(self, st: state_mod.SessionState) -> None:
        """Load ``st`` into this (fresh, empty) session. Raises StateError (the context is left empty)."""
        if st.identity != self.model.identity:
            raise state_mod.StateError("saved by another model, build or context setting")
        if st.logits.shape != (self.model.n_vocab,) or st.n_cells > self.model.n_ctx:
            raise state_mod.StateError("does not fit this model's vocabulary or context")
        ptr = st.kv.ctypes.data_as(_U8P)
        got = int(C.llama_state_seq_set_data(self._ctx, ptr, st.kv.nbytes, 0))
        if got == 0 or int(C.llama_memory_seq_pos_max(self._mem, 0)) != st.n_pos - 1:
            C.llama_memory_seq_rm(self._mem, 0, -1, -1)
            raise state_mod.StateError(f"llama.cpp did not take the state ({recent_errors() or 'no details'})")
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
        with self.model.lock:
            return self._settled_logits("Nothing has been evaluated yet: append text first.").copy()

    def next_logprobs(self) -> np.ndarray:
        """(V,) float32 log-softmax of the model's distribution for the next token."""
        logits = self.next_logits()
        lse = row_logsumexp(logits[None, :])[0]
        return (logits.astype(np.float64) - lse).astype(np.float32)

    # ------------------------------------------------------------------------------ scoring (runtime/batch.py)
    def score(
        self,
        candidates: Sequence[str | Sequence[int]],
        *,
        special: bool = False,
        keep: bool = False,
        cancel: threading.Event | None = None,
    ) -> list[ContinuationScore]:
        """Teacher-forced log-probs of each candidate after the current context, in ONE llama_decode
        (shared prefixes once, leaves never evaluated): see :func:`edge_agent.runtime.batch.score`."""
        return batch.score(self, candidates, special=special, keep=keep, cancel=cancel)

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        """Paste the first ``n_tokens`` of kept candidate ``index`` without evaluating it again: see
        :func:`edge_agent.runtime.batch.adopt`."""
        return batch.adopt(self, index, n_tokens)

    # ------------------------------------------------------------------------------ generation
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
    ) -> Generation:
        """Sample up to ``max_tokens`` tokens and append them to the conversation.

        - ``temperature`` 0: greedy; else softmax(logits / T) sampled with numpy's ``default_rng(seed)``.
        - ``grammar``: GBNF text with a ``root`` rule; a bad grammar raises ModelRuntimeError. Every
          token is checked against it (the fast path checks only the drawn token).
        - ``stop``: strings; generation ends when the text contains one. ``Generation.text`` is cut
          before it, but the tokens that produced it stay in the session (KV + history), as does an
          end-of-generation token: the session holds exactly ``Generation.tokens``. Roll back with a
          checkpoint to drop them.
        - ``on_token(piece, token_id)``: once per sampled token with the text that became final (may be
          '', text that could start a stop string is held back); after a cancel, held-back text comes
          in one last call with token id -1. The pieces concatenate to ``Generation.text``.
        - ``cancel``: checked before each token and after each callback, and it aborts a running
          decode (through the model's abort flag); stop_reason "cancelled".
        The last sampled token is left pending (not decoded) until the session needs it.
        ``Generation.logprobs``: log p of each token under the model (before grammar and temperature).
        """
        with self.model.lock, self._cancellable(cancel, raise_if_set=False):  # a set cancel -> "cancelled"
            self._check()
            self._drop_kept()
            t0 = time.perf_counter()
            ev0 = self.n_evaluated
            stream = StopStream(stop)
            tokens: list[int] = []
            lps: list[float] = []
            reason = "length"
            with Sampler(self.model, grammar=grammar, temperature=temperature, seed=seed) as sampler:
                if max_tokens > 0:
                    try:
                        self._flush()
                    except Cancelled:
                        max_tokens, reason = 0, "cancelled"
                    if self._logits is None and reason != "cancelled":
                        raise ModelRuntimeError("Generation needs a context: append text first.")
                for i in range(max(0, max_tokens)):
                    if cancel is not None and cancel.is_set():
                        reason = "cancelled"
                        break
                    if i > 0:
                        if self._free_cells() < 1:
                            reason = "length"
                            break
                        try:
                            self._flush()
                        except Cancelled:  # the abort flag stopped this token's decode; it stays pending
                            reason = "cancelled"
                            break
                    logits = self._logits
                    assert logits is not None
                    tok = sampler.sample(logits)
                    sampler.accept(tok)
                    lse = row_logsumexp(logits[None, :], self._scratch_for())[0]
                    tokens.append(tok)
                    lps.append(float(logits[tok]) - float(lse))
                    self.history.append(tok)
                    self._pending.append(tok)
                    self.n_pos += 1
                    self._logits = None
                    if self.model.is_eog(tok):
                        reason = "eos"
                        piece = stream.flush()
                    else:
                        piece = stream.feed(self.model.token_bytes(tok))
                        if stream.stopped:
                            reason = "stop"
                        elif i == max_tokens - 1:
                            piece += stream.flush()
                    if on_token is not None:
                        on_token(piece, tok)
                    if reason in ("eos", "stop"):
                        break
                    if cancel is not None and cancel.is_set():
                        reason = "cancelled"
                        break
                if reason == "cancelled":
                    rest = stream.flush()
                    if rest and on_token is not None:
                        on_token(rest, -1)
            return Generation(
                text=stream.text,
                tokens=tokens,
                stop_reason=reason,
                logprobs=lps,
                n_eval=self.n_evaluated - ev0,
                seconds=time.perf_counter() - t0,
            )

    def _scratch_for(self) -> np.ndarray:
        if self._scratch is None:
            self._scratch = np.empty((8, self.model.n_vocab), dtype=np.float32)
        return self._scratch

    # ------------------------------------------------------------------------------ introspection
    def kv_seq_ranges(self) -> dict[int, tuple[int, int]]:
        """{seq: (min pos, max pos)} for every sequence holding cells (tests use it to find leaks)."""
        with self.model.lock:
            out = {}
            for s in range(self.model.n_seq_max):
                hi = C.llama_memory_seq_pos_max(self._mem, s)
                if hi >= 0:
                    out[s] = (int(C.llama_memory_seq_pos_min(self._mem, s)), int(hi))
            return out

    def text(self) -> str:
        """The conversation as text (special tokens rendered; an image as ``<image>``), for debugging."""
        parts = []
        for t in self.history:
            parts.append("<image>" if t == IMAGE else self.model.detokenize([t], special=True))
        return "".join(parts)
