"""A context that starts small and grows (kv_type auto: f16 from the cells 512 MiB hold, up to n_ctx):
growing keeps every number (the same logits, bit for bit, as a context created at the larger size),
saved states restore across sizes, and the limit is n_ctx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.core.errors import ModelRuntimeError
from edge_agent.modelfiles import footprint
from edge_agent.runtime import Model

TEXT = "The quick brown fox jumps over the lazy dog near the old museum. "


def feed(m: Model, n_parts: int = 6) -> tuple[list[np.ndarray], object]:
    """Append text in parts (each a flush), then generate under a grammar; the logits after each part."""
    s = m.session()
    rows = []
    for i in range(n_parts):
        s.append_text(f"Part {i}. " + TEXT * 5)
        rows.append(s.next_logits())
    gen = s.generate(max_tokens=12, grammar='root ::= [a-z ]+ "."')
    rows.append(s.next_logits())
    return rows, (gen.tokens, s.n_cells, s.n_pos)


def test_a_growing_context_gives_the_numbers_of_a_large_one(tiny_models: dict[str, Path]) -> None:
    with Model.load(tiny_models["text"], n_ctx=4096, n_ctx_start=512, n_threads=1,
                    n_threads_batch=1) as small, \
            Model.load(tiny_models["text"], n_ctx=4096, n_threads=1, n_threads_batch=1) as large:
        assert (small.handle.n_ctx, small.n_ctx, large.handle.n_ctx) == (512, 4096, 4096)
        assert small.identity == large.identity  # a context's size changes none of its numbers
        got, got_end = feed(small)
        want, want_end = feed(large)
        assert small.handle.n_ctx > 512  # it grew (more than 512 cells were needed)
        assert got_end == want_end
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_growth_stops_at_n_ctx(tiny_models: dict[str, Path]) -> None:
    with Model.load(tiny_models["text"], n_ctx=1024, n_ctx_start=512, n_threads=1, n_threads_batch=1) as m:
        s = m.session()
        s.append_text(TEXT * 25)  # ~650 tokens: grows to 1024
        assert m.handle.n_ctx == 1024
        with pytest.raises(ModelRuntimeError, match="of 1024 tokens used"):
            s.append_text(TEXT * 25)
        assert s.n_cells < 1024 and s.kv_seq_ranges() == {0: (0, s.n_pos - 1)}  # nothing half-done


def test_a_saved_state_restores_into_a_smaller_start(tiny_models: dict[str, Path]) -> None:
    with Model.load(tiny_models["text"], n_ctx=4096, n_threads=1, n_threads_batch=1) as large:
        s = large.session()
        s.append_text(TEXT * 30)  # ~780 tokens
        state, want = s.save_state("t"), s.next_logits()
    with Model.load(tiny_models["text"], n_ctx=4096, n_ctx_start=512, n_threads=1,
                    n_threads_batch=1) as small:
        r = small.restore(state)
        assert small.handle.n_ctx >= state.n_cells > 512
        np.testing.assert_array_equal(r.next_logits(), want)


def test_kv_type_auto_is_f16_starting_at_a_photo_question() -> None:
    """Qwen3-VL-2B at n_ctx 8192: f16 from 2,048 cells (224 MiB; a photo question with a zoom takes ~1,500),
    growing to 8,192 (896 MiB); 4B: from 2,048 too; small models at n_ctx from the start."""
    two, four = footprint.kv_shape_of_entry("qwen3-vl", "2B"), footprint.kv_shape_of_entry("qwen3-vl", "4B")
    assert two is not None and four is not None
    assert (two.resolve(8192, "auto"), two.start_cells(8192, "auto")) == ("f16", 2048)
    assert two.bytes(8192, "auto") == 224 * 2**20 and two.bytes(8192, "auto", grown=True) == 896 * 2**20
    assert two.start_cells(8192, "q8_0") == 8192 and two.bytes(8192, "q8_0") == 476 * 2**20
    assert four.start_cells(8192, "auto") == 2048
    assert two.start_cells(4096, "auto") == 4096  # 448 MiB: no need to start smaller
    assert two.start_cells(2048, "auto") == 2048


def test_saved_states_back_to_back_keep_their_own_bytes_and_restore_exactly(
        tiny_models: dict[str, Path]) -> None:
    """``state_bytes`` copies into new pre-faulted pages each time (``prefaulted_bytes``): a state still
    held (its file being written) is never written over by the next save, and each restores to the
    logits it was saved with."""
    with Model.load(tiny_models["text"], n_ctx=2048, n_threads=1, n_threads_batch=1) as m:
        s = m.session()
        s.append_text(TEXT * 10)
        first, first_logits = s.save_state("a"), s.next_logits()
        kept = first.kv.copy()
        s.append_text("More words after the first save. " * 3)
        second, second_logits = s.save_state("b"), s.next_logits()  # the first is still held
        assert not np.shares_memory(first.kv, second.kv) and second.kv.nbytes > first.kv.nbytes
        np.testing.assert_array_equal(first.kv, kept)
        for st, want in ((first, first_logits), (second, second_logits)):
            np.testing.assert_array_equal(m.restore(st).next_logits(), want)
