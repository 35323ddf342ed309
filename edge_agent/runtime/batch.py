"""Batched teacher-forced scoring of candidate continuations, and adopting a scored candidate.

Knows: turning a prefix trie of candidates (``scoring.build_trie``) into one llama batch (candidate k
in seq k+1, a metadata-only copy of seq 0 in the unified KV cache; shared leading tokens evaluated
once; leaves never evaluated), reading log-probs and ranks from the logits rows, and giving seq 0 a
kept candidate's cells (``adopt``). Does not know prompts, rationales or drafts, nor the session's
state: ``Session.score`` / ``Session.adopt`` hand these functions the context's logits and position
and apply what they return (:class:`Scored`, :class:`Adopted`). Reaches llama.cpp through the
:class:`~edge_agent.runtime.handle.Handle` only.

Costs (SmolLM2-135M, 1 thread of a shared 2-core VM, ~600-token context): scoring the built-in six
rationales (41 tokens, 23 distinct prefixes, 17 inner trie nodes evaluated) takes the time of ~7-10
decoded tokens; see scripts/bench_runtime.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_agent.core.errors import ModelRuntimeError
from edge_agent.runtime.handle import ContextFull, Handle
from edge_agent.runtime.scoring import Trie, build_trie, row_logsumexp, split_points
from edge_agent.runtime.tokenizer import Tokenizer
from edge_agent.runtime.types import ContinuationScore


@dataclass
class Kept:
    """Candidates left in seqs 1..K by ``score(keep=True)``, for ``adopt``."""

    trie: Trie
    tokens: list[list[int]]
    decodes: int  # the handle's decode count right after scoring: the logits buffer is valid while unchanged
    row_base: int  # batch index of the first logits row of the last scoring decode


@dataclass
class Scored:
    """One group's scores, and what the session keeps of it."""

    results: list[ContinuationScore]
    kept: Kept | None  # with keep=True: the candidates' sequences stay for adopt
    n_rows: int  # candidate tokens decoded (trie inner nodes)
    timing: dict[str, float]  # seconds: decode (llama.cpp) / post (numpy over the rows)


@dataclass
class Adopted:
    """What a session appends when it adopts a kept candidate."""

    tokens: list[int]  # the adopted tokens (history and positions grow by their count)
    n_kv: int  # of them, cells now in seq 0 (a leaf's last token was never evaluated)
    logits: np.ndarray | None  # next-token logits when the last token has a row; None: it stays pending


def candidate_tokens(tok: Tokenizer, candidates: Sequence[str | Sequence[int]], *,
                     special: bool) -> list[list[int]]:
    """Token lists of the candidates (strings tokenized with ``special``); ValueError for an empty one
    or ids out of the vocabulary."""
    toks = [tok.tokenize(c, special=special) if isinstance(c, str) else [int(t) for t in c]
            for c in candidates]
    for i, t in enumerate(toks):
        if not t:
            raise ValueError(f"candidate {i} is empty")
        if min(t) < 0 or max(t) >= tok.n_vocab:
            raise ValueError(f"candidate {i} has token ids out of range")
    return toks


def score_group(h: Handle, cands: list[list[int]], *, logits: np.ndarray, n_pos: int, free: int, keep: bool,
                scratch: np.ndarray) -> Scored:
    """Score ``cands`` (at most ``n_seq_max - 1``) after a context whose next-token ``logits`` and
    position counter ``n_pos`` are given, with ``free`` KV cells left. Raises ContextFull.

    All candidates go into ONE llama_decode: candidate k lives in seq k+1 (a metadata-only copy of
    seq 0 in the unified cache), shared leading tokens are evaluated once (a trie node with several
    sequence ids), only inner trie nodes are evaluated (each candidate's last token is scored from
    its parent's logits row and never evaluated), and each candidate's first token is scored from
    the context's ``logits``. More trie nodes than the batch holds (``n_batch``) are split into several
    decodes (depth-first order keeps each valid). Positions continue from ``n_pos`` (the tracked
    counter: correct after images). Candidate sequences are removed afterwards, also on error, unless
    ``keep`` (then ``Scored.kept`` names them, for :func:`adopt`).
    """
    trie = build_trie(cands)
    n = len(trie.batch)  # inner nodes only: leaves are scored from their parent's row, never evaluated
    if n > free:
        raise ContextFull(n, h.n_ctx)
    b = h.batch
    assert b is not None
    # Per node: (log p, rank) of the node's token given its parent (or the context for roots).
    lp = np.zeros(trie.n_tokens, dtype=np.float64)
    rk = np.zeros(trie.n_tokens, dtype=np.int64)
    ctx_lse = row_logsumexp(logits[None, :], scratch)[0]
    for i, node in enumerate(trie.nodes):
        if node.parent < 0:
            v = logits[node.token]
            lp[i] = float(v) - ctx_lse
            rk[i] = int(np.count_nonzero(logits > v))

    nodes = [trie.nodes[i] for i in trie.batch]
    tok_arr = np.fromiter((nd.token for nd in nodes), dtype=np.int32, count=n)
    pos_arr = n_pos + np.fromiter((nd.depth for nd in nodes), dtype=np.int32, count=n)
    nseq_arr = np.fromiter((len(nd.seqs) for nd in nodes), dtype=np.int32, count=n)

    n_seqs = len(cands) if n else 0  # nothing to evaluate (one-token candidates): no sequences
    for k in range(n_seqs):
        h.seq_cp(0, k + 1, -1, -1)
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
            h.decode(m)
            t1 = time.perf_counter()
            t_decode += t1 - t0
            row_base = s
            rows = h.logits_rows(m)  # (m, V) zero-copy view, batch order
            lse = row_logsumexp(rows, scratch)
            for r in range(m):
                row = rows[r]
                for t, c in nodes[s + r].children.items():
                    v = row[t]
                    lp[c] = float(v) - lse[r]
                    rk[c] = int(np.count_nonzero(row > v))
            t_post += time.perf_counter() - t1
        ok = True
    finally:
        if not (keep and ok):
            for k in range(n_seqs):
                h.seq_rm(k + 1, -1, -1)
    results = []
    for k, path in enumerate(trie.paths):
        lps = lp[path]
        total = float(lps.sum())
        results.append(ContinuationScore(tokens=cands[k], logprobs=lps, ranks=rk[path], sum=total,
                                         mean=total / len(path), count=len(path)))
    kept = Kept(trie=trie, tokens=cands, decodes=h.decodes, row_base=row_base) if keep else None
    return Scored(results=results, kept=kept, n_rows=n, timing={"decode": t_decode, "post": t_post})


def adopt(h: Handle, kept: Kept, index: int, n_tokens: int | None, n_pos: int) -> Adopted:
    """The first ``n_tokens`` (default: all) of kept candidate ``index``, pasted into seq 0 at ``n_pos``.

    No token is evaluated again: the candidate's KV cells get seq 0 added (metadata only). The
    next-token logits come from the scoring batch when that node had a logits row; otherwise (the
    candidate's last token: a leaf) the last token is left pending and evaluated with the next input.
    The resulting state is the one ``append_tokens`` of the same tokens gives. The caller drops the
    kept sequences afterwards (:func:`release`).
    """
    if not 0 <= index < len(kept.tokens):
        raise IndexError(f"candidate index {index} out of range")
    toks = kept.tokens[index]
    n = len(toks) if n_tokens is None else n_tokens
    if not 0 <= n <= len(toks):
        raise ValueError(f"n_tokens must be in [0, {len(toks)}]")
    if n == 0:
        return Adopted(tokens=[], n_kv=0, logits=None)
    node = kept.trie.nodes[kept.trie.paths[index][n - 1]]
    logits = None
    # An inner node's KV and logits row exist (the row only while it is still in the buffer: last
    # decode, nothing decoded since); a leaf was never evaluated.
    if node.row >= 0 and kept.decodes == h.decodes and node.row >= kept.row_base:
        logits = h.logits_rows(node.row - kept.row_base + 1)[node.row - kept.row_base].copy()
    n_kv = n if logits is not None else n - 1
    if n_kv:
        h.seq_cp(index + 1, 0, n_pos, n_pos + n_kv)
    return Adopted(tokens=list(toks[:n]), n_kv=n_kv, logits=logits)


def release(h: Handle, kept: Kept) -> None:
    """Remove the kept candidates' sequences (seqs 1..K)."""
    for k in range(len(kept.tokens)):
        h.seq_rm(k + 1, -1, -1)


def check_group(h: Handle, n_candidates: int, keep: bool) -> int:
    """Candidates one group takes (n_seq_max - 1); ModelRuntimeError when scoring cannot run."""
    group = h.n_seq_max - 1
    if group < 1:
        raise ModelRuntimeError("Scoring needs a context with n_seq_max >= 2. "
                                "Load the model with n_seq_max > 1.")
    if keep and n_candidates > group:
        raise ModelRuntimeError(f"score(keep=True) takes at most {group} candidates (n_seq_max - 1).")
    return group
