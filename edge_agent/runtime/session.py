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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.errors import Cancelled, ImageError, ModelFileError, ModelRuntimeError
from edge_agent.runtime import state as state_mod
from edge_agent.runtime import vision
from edge_agent.runtime._lib import C, clear_errors, recent_errors
from edge_agent.runtime.sampling import Sampler
from edge_agent.runtime.scoring import Trie, build_trie, row_logsumexp, split_points
from edge_agent.runtime.textstream import StopStream
from edge_agent.runtime.types import Checkpoint, ContinuationScore, Generation, ImageChunk, TokenCallback

if TYPE_CHECKING:
    from edge_agent.runtime.model import Model

IMAGE = state_mod.IMAGE  # history placeholder for one image
_U8P = ctypes.POINTER(ctypes.c_uint8)


@dataclass
class _Kept:
    """Candidates left in seqs 1..K by ``score(keep=True)``, for ``adopt``."""

    trie: Trie
    tokens: list[list[int]]
    serial: int  # decode serial right after scoring: the logits buffer is valid while unchanged
    row_base: int  # batch index of the first logits row of the last scoring decode


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
        self._kept: _Kept | None = None
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
        clear_errors()
        rc = C.llama_decode(self._ctx, b.struct)
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
                            result = self._eval_image_chunk(part.chunk, prep, vision.image_digest(image))
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
        try:
            new_pos = vision.decode(self.model, chunk, emb, self.n_pos, 0)
        except ModelRuntimeError:
            C.llama_memory_seq_rm(self._mem, 0, self.n_pos, -1)
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
            self._check()
            self._drop_kept()
            self._flush()
            if self._logits is None:
                raise ModelRuntimeError("Nothing to save: the context is empty or ends in an image.")
            size = int(C.llama_state_seq_get_size(self._ctx, 0))
            kv = np.empty(size, dtype=np.uint8)
            got = int(C.llama_state_seq_get_data(self._ctx, kv.ctypes.data_as(_U8P), size, 0))
            if got != size:
                raise ModelRuntimeError(f"llama.cpp copied {got} of {size} bytes of the context state.")
            return state_mod.SessionState(
                identity=dict(self.model.identity), key=state_mod.sequence_key(self.model.identity, self.history, self.images),
                history=list(self.history), images=list(self.images), n_pos=self.n_pos, n_cells=self.n_cells,
                logits=self._logits.copy(), kv=kv, label=label,
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
    def next_logits(self) -> np.ndarray:
        """(V,) float32 raw logits for the next token (a copy)."""
        with self.model.lock:
            self._check()
            self._drop_kept()
            self._flush()
            if self._logits is None:
                raise ModelRuntimeError("Nothing has been evaluated yet: append text first.")
            return self._logits.copy()

    def next_logprobs(self) -> np.ndarray:
        """(V,) float32 log-softmax of the model's distribution for the next token."""
        logits = self.next_logits()
        lse = row_logsumexp(logits[None, :])[0]
        return (logits.astype(np.float64) - lse).astype(np.float32)

    # ------------------------------------------------------------------------------ scoring
    def score(
        self,
        candidates: Sequence[str | Sequence[int]],
        *,
        special: bool = False,
        keep: bool = False,
        cancel: threading.Event | None = None,
    ) -> list[ContinuationScore]:
        """Teacher-forced log-probs of each candidate after the current context.

        All candidates go into ONE llama_decode: candidate k lives in seq k+1 (a metadata-only copy of
        seq 0 in the unified cache), shared leading tokens are evaluated once (a trie node with several
        sequence ids), only inner trie nodes are evaluated (each candidate's last token is scored from
        its parent's logits row and never evaluated), and each candidate's first token is scored from
        the saved context logits. Limits, documented rather than hidden: more
        trie nodes than ``n_batch`` are split into several decodes (depth-first order keeps each valid),
        and more candidates than ``n_seq_max - 1`` are scored in groups (one decode or more per group).
        Candidate sequences are removed afterwards, also on error, unless ``keep=True`` (then they stay
        until :meth:`adopt` or the next call on this session).

        Strings are tokenized with ``special`` (default False: candidate text is plain text); token
        lists are used as given. Positions continue from the tracked counter (correct after images).
        ``cancel`` aborts the scoring decode (``Cancelled``; the candidate sequences are removed).
        """
        with self.model.lock, self._cancellable(cancel):
            self._check()
            self._drop_kept()
            toks = [
                self.model.tokenize(c, special=special) if isinstance(c, str) else [int(t) for t in c] for c in candidates
            ]
            for i, t in enumerate(toks):
                if not t:
                    raise ValueError(f"candidate {i} is empty")
                if min(t) < 0 or max(t) >= self.model.n_vocab:
                    raise ValueError(f"candidate {i} has token ids out of range")
            if not toks:
                return []
            group = self.model.n_seq_max - 1
            if group < 1:
                raise ModelRuntimeError("Scoring needs a context with n_seq_max >= 2. Load the model with n_seq_max > 1.")
            if keep and len(toks) > group:
                raise ModelRuntimeError(f"score(keep=True) takes at most {group} candidates (n_seq_max - 1).")
            self._flush()
            if self._logits is None:
                raise ModelRuntimeError("Scoring needs a context: append text first.")
            out: list[ContinuationScore] = []
            for s in range(0, len(toks), group):
                out.extend(self._score_group(toks[s : s + group], keep))
            return out

    def _score_group(self, cands: list[list[int]], keep: bool) -> list[ContinuationScore]:
        trie = build_trie(cands)
        n_nodes, batch = trie.n_tokens, trie.batch
        n = len(batch)  # inner nodes only: leaves are scored from their parent's row, never evaluated
        if n > self._free_cells():
            raise self._context_full(n)
        b = self.model._batch
        assert b is not None
        V = self.model.n_vocab
        if self._scratch is None:
            self._scratch = np.empty((8, V), dtype=np.float32)
        # Per node: (log p, rank) of the node's token given its parent (or the context for roots).
        lp = np.zeros(n_nodes, dtype=np.float64)
        rk = np.zeros(n_nodes, dtype=np.int64)
        ctx_logits = self._logits
        assert ctx_logits is not None
        ctx_lse = row_logsumexp(ctx_logits[None, :], self._scratch)[0]
        for i, node in enumerate(trie.nodes):
            if node.parent < 0:
                v = ctx_logits[node.token]
                lp[i] = float(v) - ctx_lse
                rk[i] = int(np.count_nonzero(ctx_logits > v))

        nodes = [trie.nodes[i] for i in batch]
        tok_arr = np.fromiter((nd.token for nd in nodes), dtype=np.int32, count=n)
        pos_arr = self.n_pos + np.fromiter((nd.depth for nd in nodes), dtype=np.int32, count=n)
        nseq_arr = np.fromiter((len(nd.seqs) for nd in nodes), dtype=np.int32, count=n)

        n_seqs = len(cands) if n else 0  # nothing to evaluate (one-token candidates): no sequences
        for k in range(n_seqs):
            C.llama_memory_seq_cp(self._mem, 0, k + 1, -1, -1)
        ok = False
        row_base = n  # batch index of the first row still in llama.cpp's logits buffer (n: none)
        t_decode = t_post = 0.0
        try:
            for s, e in split_points(trie, b.cap):
                m = e - s
                b.tok[:m] = tok_arr[s:e]
                b.pos[:m] = pos_arr[s:e]
                b.nseq[:m] = nseq_arr[s:e]
                for j in range(m):
                    seqs = nodes[s + j].seqs
                    b.seq[j, : len(seqs)] = seqs
                    b.seq[j, : len(seqs)] += 1
                b.out[:m] = 1  # every inner node's row predicts its children
                t0 = time.perf_counter()
                self._decode(m)
                t1 = time.perf_counter()
                t_decode += t1 - t0
                self.n_scored += m
                row_base = s
                rows = self._logits_rows(m)  # (m, V) zero-copy view, batch order
                lse = row_logsumexp(rows, self._scratch)
                for r in range(m):
                    row = rows[r]
                    for t, c in nodes[s + r].children.items():
                        v = row[t]
                        lp[c] = float(v) - lse[r]
                        rk[c] = int(np.count_nonzero(row > v))
                t_post += time.perf_counter() - t1
            ok = True
            self.last_timing = {"decode": t_decode, "post": t_post}
        finally:
            if not (keep and ok):
                for k in range(n_seqs):
                    C.llama_memory_seq_rm(self._mem, k + 1, -1, -1)
        if keep:
            self._kept = _Kept(trie=trie, tokens=cands, serial=self._serial, row_base=row_base)
        results = []
        for k, path in enumerate(trie.paths):
            lps = lp[path]
            total = float(lps.sum())
            results.append(
                ContinuationScore(tokens=cands[k], logprobs=lps, ranks=rk[path], sum=total, mean=total / len(path), count=len(path))
            )
        return results

    def adopt(self, index: int, n_tokens: int | None = None) -> int:
        """Make the first ``n_tokens`` (default: all) of kept candidate ``index`` part of the conversation.

        Needs ``score(..., keep=True)`` as the previous call on this session. No token is evaluated
        again: the candidate's KV cells get seq 0 added (metadata only). The next-token logits come
        from the scoring batch when that node had a logits row; otherwise (the candidate's last token:
        a leaf) the last token is left pending and evaluated with the next input. The resulting state
        is the one ``append_tokens`` of the same tokens gives. Returns the number of tokens adopted.
        """
        with self.model.lock:
            self._check()
            kept = self._kept
            if kept is None:
                raise ModelRuntimeError("adopt() needs score(..., keep=True) immediately before it.")
            try:
                if not 0 <= index < len(kept.tokens):
                    raise IndexError(f"candidate index {index} out of range")
                toks = kept.tokens[index]
                n = len(toks) if n_tokens is None else n_tokens
                if not 0 <= n <= len(toks):
                    raise ValueError(f"n_tokens must be in [0, {len(toks)}]")
                if n == 0:
                    return 0
                node = kept.trie.nodes[kept.trie.paths[index][n - 1]]
                p0 = self.n_pos
                logits = None
                # An inner node's KV and logits row exist (the row only while it is still in the
                # buffer: last decode, nothing decoded since); a leaf was never evaluated.
                if node.row >= 0 and kept.serial == self._serial and node.row >= kept.row_base:
                    logits = self._logits_rows(node.row - kept.row_base + 1)[node.row - kept.row_base].copy()
                n_kv = n if logits is not None else n - 1
                if n_kv:
                    C.llama_memory_seq_cp(self._mem, index + 1, 0, p0, p0 + n_kv)
                self.history.extend(toks[:n])
                self.n_pos += n
                self.n_cells += n_kv
                self._pending = [] if logits is not None else [toks[n - 1]]
                self._logits = logits
                return n
            finally:
                self._drop_kept()

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
