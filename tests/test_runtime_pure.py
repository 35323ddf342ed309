"""Pure parts of the runtime (no llama.cpp): the candidate trie, row log-softmax, stop-string streaming."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edge_agent.runtime.scoring import build_trie, logprob_and_rank, row_logsumexp, split_points
from edge_agent.runtime.textstream import StopStream


def test_trie_shares_prefixes_and_orders_depth_first():
    """Shared leading tokens become one node; parents precede children; each branch is contiguous."""
    cands = [[1, 2, 3], [1, 2, 4, 5], [1, 7], [9]]
    t = build_trie(cands)
    assert t.n_tokens == 7  # 1,2,3,4,5,7,9
    assert [t.nodes[i].token for i in t.paths[1]] == [1, 2, 4, 5]
    for i, n in enumerate(t.nodes):
        assert n.parent < i
        for s in n.seqs:  # every node of candidate s lies on its path
            assert i in t.paths[s]
    # depth-first: every node's subtree is a contiguous range right after it
    assert [n.token for n in t.nodes] == [1, 2, 3, 4, 5, 7, 9]
    root = t.nodes[t.paths[0][0]]
    assert sorted(root.seqs) == [0, 1, 2]


def test_trie_evaluates_only_inner_nodes():
    """The batch holds the nodes with children (their rows predict the children); leaves are skipped."""
    t = build_trie([[1, 2, 3], [1, 2, 4], [5]])
    assert [t.nodes[i].token for i in t.batch] == [1, 2]
    assert t.n_rows == 2 and [t.nodes[i].row for i in t.batch] == [0, 1]  # row = batch index
    assert all(t.nodes[i].row == -1 for p in t.paths for i in p[-1:])  # last tokens: never evaluated
    t2 = build_trie([[1, 2], [1, 2, 3]])  # a candidate that is a prefix of another
    assert t2.n_tokens == 3 and t2.n_rows == 2  # token 2 ends one candidate but predicts 3
    assert build_trie([[7], [8]]).batch == []  # one-token candidates need no evaluation at all


def test_trie_duplicates_and_split_points():
    """Identical candidates share every node; split ranges cover all nodes in order."""
    t = build_trie([[4, 5, 6], [4, 5, 6]])
    assert t.n_tokens == 3 and t.paths[0] == t.paths[1]
    t = build_trie([[i, i + 1, i + 2] for i in range(0, 30, 3)])
    ranges = split_points(t, 3)
    assert ranges[0] == (0, 3) and ranges[-1][1] == len(t.batch) == 20
    assert sum(e - s for s, e in ranges) == len(t.batch)


def test_row_logsumexp_matches_float64_reference():
    """Blocked float32 log-sum-exp equals a float64 reference within 1e-5."""
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((19, 5000)) * 8).astype(np.float32)
    ref = np.log(np.exp(rows.astype(np.float64) - rows.max(1, keepdims=True)).sum(1)) + rows.max(1)
    np.testing.assert_allclose(row_logsumexp(rows), ref, atol=1e-5)
    lp, rank = logprob_and_rank(rows[0], ref[0], int(np.argmax(rows[0])))
    assert rank == 0 and lp <= 0
    lp2, rank2 = logprob_and_rank(rows[0], ref[0], int(np.argmin(rows[0])))
    assert rank2 == 4999 and lp2 < lp


def _stream(pieces, stop):
    s = StopStream(stop)
    out = [s.feed(p) for p in pieces]
    out.append(s.flush())
    return s, out


def test_stop_string_across_token_boundaries():
    """A stop string split over tokens is found, cut from the text, and never streamed."""
    s, out = _stream([b"The answer", b" is 4</", b"ans", b"wer> tail"], ["</answer>"])
    assert s.stopped and s.text == "The answer is 4"
    assert "".join(out) == s.text
    assert "</" not in "".join(out)


def test_held_back_prefix_is_released_when_no_stop_follows():
    """Text that only looked like a stop prefix is released once it cannot be one."""
    s, out = _stream([b"a <", b"b>", b"c"], ["<stop>"])
    assert not s.stopped and s.text == "a <b>c"
    assert out[0] == "a " and "".join(out) == "a <b>c"


def test_utf8_split_across_tokens():
    """A multi-byte character split over two tokens is emitted whole, once."""
    e = "é".encode()
    s, out = _stream([b"caf" + e[:1], e[1:] + b"!"], [])
    assert out[0] == "caf" and out[1] == "é!" and s.text == "café!"


def test_importing_runtime_does_not_import_llama_cpp():
    """`from edge_agent.runtime import Model` is lazy: llama_cpp loads only when Model.load runs."""
    code = (
        "import sys\n"
        "from edge_agent.runtime import ContinuationScore, Model\n"
        "assert 'llama_cpp' not in sys.modules, 'imported too early'\n"
        "try:\n"
        "    Model.load('/nonexistent.gguf')\n"
        "except Exception:\n"
        "    pass\n"
        "assert 'llama_cpp' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("stop", [["x"], ["xyz", "y"]])
def test_stop_earliest_match_wins(stop):
    """With several stop strings the earliest occurrence in the text wins."""
    s, _ = _stream([b"abyxyz"], stop)
    assert s.text == ("ab" if "y" in stop else "aby")


def test_image_digests_are_sha256_of_the_bytes_whichever_object_holds_them():
    """The digests kept for the latest images: equal bytes (another object, a bytearray) give SHA-256 of them,
    different bytes a different digest, and more images than are kept are digested anew."""
    import hashlib

    from edge_agent.runtime.state import image_digest

    pngs = [bytes([i]) * 5000 for i in range(7)]
    for p in pngs + pngs[::-1]:
        assert image_digest(p) == hashlib.sha256(p).hexdigest()
        assert image_digest(
            bytes(bytearray(p))) == image_digest(bytearray(p)) == hashlib.sha256(p).hexdigest()
    assert len({image_digest(p) for p in pngs}) == len(pngs)
