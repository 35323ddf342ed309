"""Pure helpers for batched continuation scoring: the candidate prefix trie and row log-softmax.

Knows token ids and float rows; does not know llama.cpp (no llama_cpp import), sequences in a KV
cache, or what the candidates mean. ``session.py`` turns a :class:`Trie` into one llama batch.

Trie layout (why): K candidates that share leading tokens are evaluated once. The batch holds the
trie's inner nodes (nodes with children) in depth-first order, so each sequence's tokens appear in
increasing position order and every node's sequence set contains its children's (the two rules
llama.cpp's batch validator checks for tokens with several sequence ids). Each batch entry requests
logits: an inner node's row predicts its children. Leaves (a candidate's last token) are never
evaluated: their log-prob comes from the parent's row, and nothing reads their KV or logits (an
adopted candidate's last token is evaluated later, with the next input). A candidate's first token is
predicted by the context's saved logits, so a one-token candidate costs no evaluation at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TrieNode:
    token: int
    depth: int  # 0 = first token of a candidate (position n_pos + depth)
    parent: int  # index of the parent node, -1 for a first token
    seqs: list[int] = field(default_factory=list)  # candidate indices passing through this node
    children: dict[int, int] = field(default_factory=dict)  # token -> node index
    row: int = -1  # index in the batch = row of this node's logits (-1: a leaf, not evaluated)


@dataclass
class Trie:
    """Nodes in depth-first order; ``paths[k]`` = node indices of candidate k, one per token;
    ``batch`` = the inner nodes to evaluate, in batch (= logits row) order."""

    nodes: list[TrieNode]
    paths: list[list[int]]
    batch: list[int]

    @property
    def n_tokens(self) -> int:
        """Distinct (prefix, token) pairs: what scoring without a trie-aware leaf skip would evaluate."""
        return len(self.nodes)

    @property
    def n_rows(self) -> int:
        return len(self.batch)


def build_trie(candidates: Sequence[Sequence[int]]) -> Trie:
    """Prefix trie over token lists, nodes renumbered in depth-first (pre-)order."""
    # Build with insertion-order children, then renumber by DFS so parents precede children and
    # each branch is contiguous.
    tmp: list[TrieNode] = []
    roots: dict[int, int] = {}
    tmp_paths: list[list[int]] = []
    for k, toks in enumerate(candidates):
        path: list[int] = []
        level = roots
        parent = -1
        for d, t in enumerate(toks):
            t = int(t)
            idx = level.get(t)
            if idx is None:
                idx = len(tmp)
                tmp.append(TrieNode(token=t, depth=d, parent=parent))
                level[t] = idx
            tmp[idx].seqs.append(k)
            path.append(idx)
            parent = idx
            level = tmp[idx].children
        tmp_paths.append(path)

    order: list[int] = []
    stack = list(reversed(roots.values()))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(tmp[i].children.values()))
    new_index = {old: new for new, old in enumerate(order)}
    nodes: list[TrieNode] = []
    for old in order:
        n = tmp[old]
        nodes.append(
            TrieNode(
                token=n.token,
                depth=n.depth,
                parent=new_index[n.parent] if n.parent >= 0 else -1,
                seqs=n.seqs,
                children={t: new_index[c] for t, c in n.children.items()},
            )
        )
    paths = [[new_index[i] for i in p] for p in tmp_paths]
    batch: list[int] = []
    for i, n in enumerate(nodes):
        if n.children:
            n.row = len(batch)
            batch.append(i)
    return Trie(nodes=nodes, paths=paths, batch=batch)


def split_points(trie: Trie, max_tokens: int) -> list[tuple[int, int]]:
    """[start, end) ranges of ``trie.batch`` of at most ``max_tokens`` each (one llama_decode per range).

    DFS order keeps every range valid for llama.cpp: a node's ancestors are in the same or an
    earlier range, so the sequences sharing a node have identical KV contents when it is decoded.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    n = len(trie.batch)
    return [(s, min(s + max_tokens, n)) for s in range(0, n, max_tokens)]


# Rows processed per block in row_logsumexp: keeps the (block, V) float32 scratch in cache-friendly
# sizes (8 x 152k x 4 B = 4.9 MB) instead of one (rows, V) temporary.
_BLOCK = 8


def row_logsumexp(rows: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """(R, V) float32 -> (R,) float64 log-sum-exp of each row (float32 work, float64 result).

    Cost: one max pass, one exp pass and one sum pass over R x V floats (the exp dominates,
    ~1 ns/element). ``scratch`` (>= (_BLOCK, V) float32) avoids allocations on repeated calls.
    """
    n, v = rows.shape
    out = np.empty(n, dtype=np.float64)
    if scratch is None or scratch.shape[0] < _BLOCK or scratch.shape[1] != v:
        scratch = np.empty((_BLOCK, v), dtype=np.float32)
    for s in range(0, n, _BLOCK):
        e = min(s + _BLOCK, n)
        blk = rows[s:e]
        m = blk.max(axis=1)
        buf = scratch[: e - s]
        np.subtract(blk, m[:, None], out=buf)
        np.exp(buf, out=buf)
        out[s:e] = m.astype(np.float64) + np.log(buf.sum(axis=1, dtype=np.float64))
    return out


def logprob_and_rank(row: np.ndarray, lse: float, token: int) -> tuple[float, int]:
    """log p(token) under one logits row, and how many entries score strictly higher (0 = argmax)."""
    v = row[token]
    return float(v) - lse, int(np.count_nonzero(row > v))
