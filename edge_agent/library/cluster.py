"""Clustering the moves: TF-IDF word vectors and average-linkage agglomerative clustering.

Knows: vectors and cosine similarity. Does not know what the texts mean, models (model embeddings
come in as vectors, ``edge_agent.runtime.embed``) or actions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from edge_agent.library.generalise import WORD


def lexical_vectors(texts: Sequence[str]) -> np.ndarray:
    """TF-IDF over lower-cased words and word pairs, L2-normalised: (n, vocabulary) float64."""
    docs = []
    for t in texts:
        w = [x.lower() for x in WORD.findall(t)]
        docs.append(Counter(w + [f"{a} {b}" for a, b in zip(w, w[1:], strict=False)]))
    vocab = sorted({k for d in docs for k in d})
    index = {k: i for i, k in enumerate(vocab)}
    df = Counter(k for d in docs for k in d)
    n = len(docs)
    m = np.zeros((n, max(1, len(vocab))), dtype=np.float64)
    for r, d in enumerate(docs):
        for k, c in d.items():
            m[r, index[k]] = (1 + math.log(c)) * (math.log((1 + n) / (1 + df[k])) + 1)
    return normalise(m)


def normalise(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1.0)


def cluster(vectors: np.ndarray, weights: Sequence[int], threshold: float) -> list[list[int]]:
    """Average-linkage agglomerative clustering on cosine similarity of L2-normalised rows.

    ``weights[i]`` = how many turns row i stands for (identical texts are one row). Merges the most
    similar pair until no pair's average (turn-weighted) similarity reaches ``threshold``. Returns
    clusters as row-index lists, largest (by weight) first. O(n^2) memory, O(n^3) time worst case.
    """
    n = len(vectors)
    if n == 0:
        return []
    sim = np.asarray(vectors @ vectors.T, dtype=np.float64)
    np.fill_diagonal(sim, -np.inf)
    w = np.asarray(weights, dtype=np.float64)
    members: list[list[int] | None] = [[i] for i in range(n)]
    alive = np.ones(n, dtype=bool)
    while alive.sum() > 1:
        flat = int(np.argmax(sim))
        a, b = divmod(flat, n)
        if not sim[a, b] >= threshold:
            break
        # Lance-Williams update for average linkage: sim(a+b, k) = (w_a sim(a,k) + w_b sim(b,k)) / (w_a + w_b)
        new = (w[a] * sim[a] + w[b] * sim[b]) / (w[a] + w[b])
        sim[a, :] = new
        sim[:, a] = new
        sim[a, a] = -np.inf
        sim[b, :] = -np.inf
        sim[:, b] = -np.inf
        w[a] += w[b]
        alive[b] = False
        members[a] = (members[a] or []) + (members[b] or [])
        members[b] = None
    out = [m for m in members if m is not None]
    weight = np.asarray(weights, dtype=np.float64)
    out.sort(key=lambda m: (-float(weight[m].sum()), min(m)))
    return out

