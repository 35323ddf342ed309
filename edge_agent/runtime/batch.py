"""Batched teacher-forced scoring of candidate continuations, and adopting a scored candidate.

Knows: turning a prefix trie of candidates (``scoring.build_trie``) into one llama batch (candidate k
in seq k+1, a metadata-only copy of seq 0 in the unified KV cache; shared leading tokens evaluated
once; leaves never evaluated), reading log-probs and ranks from the logits rows, and giving seq 0 a
kept candidate's cells (``adopt``). Does not know prompts, rationales or drafts: ``Session.score`` and
``Session.adopt`` call these functions with the session whose KV cache they use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.errors import ModelRuntimeError
from edge_agent.runtime._lib import C
from edge_agent.runtime.scoring import Trie, build_trie, row_logsumexp, split_points
from edge_agent.runtime.types import ContinuationScore

if TYPE_CHECKING:
    from edge_agent.runtime.session import Session


@dataclass
class Kept:
    """Candidates left in seqs 1..K by ``score(keep=True)``, for ``adopt``."""

    trie: Trie
    tokens: list[list[int]]
    serial: int  # decode serial right after scoring: the logits buffer is valid while unchanged
    row_base: int  # batch index of the first logits row of the last scoring decode


def score(
    sess: Session,
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
    with sess.model.lock, sess._cancellable(cancel):
        sess._check()
        sess._drop_kept()
        toks = [
            sess.model.tokenize(c, special=special) if isinstance(c, str) else [int(t) for t in c] for c in candidates
        ]
        for i, t in enumerate(toks):
            if not t:
                raise ValueError(f"candidate {i} is empty")
            if min(t) < 0 or max(t) >= sess.model.n_vocab:
                raise ValueError(f"candidate {i} has token ids out of range")
        if not toks:
            return []
        group = sess.model.n_seq_max - 1
        if group < 1:
            raise ModelRuntimeError("Scoring needs a context with n_seq_max >= 2. Load the model with n_seq_max > 1.")
        if keep and len(toks) > group:
            raise ModelRuntimeError(f"score(keep=True) takes at most {group} candidates (n_seq_max - 1).")
        sess._flush()
        if sess._logits is None:
            raise ModelRuntimeError("Scoring needs a context: append text first.")
        out: list[ContinuationScore] = []
        for s in range(0, len(toks), group):
            out.extend(_score_group(sess, toks[s : s + group], keep))
        return out

def _score_group(sess: Session, cands: list[list[int]], keep: bool) -> list[ContinuationScore]:
    trie = build_trie(cands)
    n_nodes, batch = trie.n_tokens, trie.batch
    n = len(batch)  # inner nodes only: leaves are scored from their parent's row, never evaluated
    if n > sess._free_cells():
        raise sess._context_full(n)
    b = sess.model._batch
    assert b is not None
    V = sess.model.n_vocab
    if sess._scratch is None:
        sess._scratch = np.empty((8, V), dtype=np.float32)
    # Per node: (log p, rank) of the node's token given its parent (or the context for roots).
    lp = np.zeros(n_nodes, dtype=np.float64)
    rk = np.zeros(n_nodes, dtype=np.int64)
    ctx_logits = sess._logits
    assert ctx_logits is not None
    ctx_lse = row_logsumexp(ctx_logits[None, :], sess._scratch)[0]
    for i, node in enumerate(trie.nodes):
        if node.parent < 0:
            v = ctx_logits[node.token]
            lp[i] = float(v) - ctx_lse
            rk[i] = int(np.count_nonzero(ctx_logits > v))

    nodes = [trie.nodes[i] for i in batch]
    tok_arr = np.fromiter((nd.token for nd in nodes), dtype=np.int32, count=n)
    pos_arr = sess.n_pos + np.fromiter((nd.depth for nd in nodes), dtype=np.int32, count=n)
    nseq_arr = np.fromiter((len(nd.seqs) for nd in nodes), dtype=np.int32, count=n)

    n_seqs = len(cands) if n else 0  # nothing to evaluate (one-token candidates): no sequences
    for k in range(n_seqs):
        C.llama_memory_seq_cp(sess._mem, 0, k + 1, -1, -1)
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
            sess._decode(m)
            t1 = time.perf_counter()
            t_decode += t1 - t0
            sess.n_scored += m
            row_base = s
            rows = sess._logits_rows(m)  # (m, V) zero-copy view, batch order
            lse = row_logsumexp(rows, sess._scratch)
            for r in range(m):
                row = rows[r]
                for t, c in nodes[s + r].children.items():
                    v = row[t]
                    lp[c] = float(v) - lse[r]
                    rk[c] = int(np.count_nonzero(row > v))
            t_post += time.perf_counter() - t1
        ok = True
        sess.last_timing = {"decode": t_decode, "post": t_post}
    finally:
        if not (keep and ok):
            for k in range(n_seqs):
                C.llama_memory_seq_rm(sess._mem, k + 1, -1, -1)
    if keep:
        sess._kept = Kept(trie=trie, tokens=cands, serial=sess._serial, row_base=row_base)
    results = []
    for k, path in enumerate(trie.paths):
        lps = lp[path]
        total = float(lps.sum())
        results.append(
            ContinuationScore(tokens=cands[k], logprobs=lps, ranks=rk[path], sum=total, mean=total / len(path), count=len(path))
        )
    return results

def adopt(sess: Session, index: int, n_tokens: int | None = None) -> int:
    """Make the first ``n_tokens`` (default: all) of kept candidate ``index`` part of the conversation.

    Needs ``score(..., keep=True)`` as the previous call on this session. No token is evaluated
    again: the candidate's KV cells get seq 0 added (metadata only). The next-token logits come
    from the scoring batch when that node had a logits row; otherwise (the candidate's last token:
    a leaf) the last token is left pending and evaluated with the next input. The resulting state
    is the one ``append_tokens`` of the same tokens gives. Returns the number of tokens adopted.
    """
    with sess.model.lock:
        sess._check()
        kept = sess._kept
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
            p0 = sess.n_pos
            logits = None
            # An inner node's KV and logits row exist (the row only while it is still in the
            # buffer: last decode, nothing decoded since); a leaf was never evaluated.
            if node.row >= 0 and kept.serial == sess._serial and node.row >= kept.row_base:
                logits = sess._logits_rows(node.row - kept.row_base + 1)[node.row - kept.row_base].copy()
            n_kv = n if logits is not None else n - 1
            if n_kv:
                C.llama_memory_seq_cp(sess._mem, index + 1, 0, p0, p0 + n_kv)
            sess.history.extend(toks[:n])
            sess.n_pos += n
            sess.n_cells += n_kv
            sess._pending = [] if logits is not None else [toks[n - 1]]
            sess._logits = logits
            return n
        finally:
            sess._drop_kept()
