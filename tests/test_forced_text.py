"""Forced text inside an action, evaluated in one verified batch (runtime.forced), against plain grammar
decoding token by token: the same tokens, the same text and log-probs, and the same context after the
action (history, KV cells, the next logits), on the real Qwen 0.5B and on the tiny Qwen3-VL model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.agent.actions import HEADS, TAIL_REST, TAIL_STOP, tail_grammar
from edge_agent.agent.prompts import THINK_CLOSE, question_segments, system_prompt
from edge_agent.runtime import Model

RATIONALE = {"zoom": "I should zoom in on the small sign to read it.",
             "text_search": "I should search the web for the opening hours.",
             "image_search": "I should search the web for this image."}


def context(action: str) -> str:
    """A question's context up to the head of ``action`` (as the loop writes it in SSR mode)."""
    turn = "".join(seg.text for seg in question_segments("What does the small sign on the door say?", None)
                   if hasattr(seg, "text"))
    return (system_prompt(("image_search", "text_search", "zoom"), has_image=True) + turn
            + RATIONALE[action] + THINK_CLOSE + HEADS[action])


def run_action(m: Model, action: str, *, forced: bool, temperature: float = 0.0,
               stop_when_refused: bool = True) -> dict[str, Any]:
    s = m.session()
    s.forced_batches = forced
    s.forced_stop_when_refused = stop_when_refused
    s.append_text(context(action))
    d0 = s.n_decodes
    gen = s.generate(max_tokens=160, grammar=tail_grammar(action, n_images=2), stop=[TAIL_STOP[action]],
                     temperature=temperature, seed=7)
    decodes = s.n_decodes - d0
    s.append_text(TAIL_REST[action])  # the loop's fixed rest of the action
    return {"tokens": gen.tokens, "text": gen.text, "reason": gen.stop_reason,
            "logprobs": np.array(gen.logprobs),
            "history": list(s.history), "cells": s.n_cells, "n_pos": s.n_pos, "logits": s.next_logits(),
            "decodes": decodes}


def assert_same(plain: dict[str, Any], batched: dict[str, Any], *, atol: float = 1e-4) -> None:
    assert batched["tokens"] == plain["tokens"] and batched["text"] == plain["text"]
    assert batched["reason"] == plain["reason"] == "stop"
    assert batched["history"] == plain["history"]
    assert (batched["cells"], batched["n_pos"]) == (plain["cells"], plain["n_pos"])
    np.testing.assert_allclose(batched["logprobs"], plain["logprobs"], atol=atol)
    np.testing.assert_allclose(batched["logits"], plain["logits"], atol=atol)
    assert int(np.argmax(batched["logits"])) == int(np.argmax(plain["logits"]))


def batching_gap(m: Model, history: list[int], n: int) -> float:
    """llama.cpp's own numerics: the largest logit difference after ``history`` between its last ``n``
    tokens decoded one at a time and in one batch (quantized weights take other kernels in a batch)."""
    out = []
    for one_by_one in (True, False):
        s = m.session()
        s.append_tokens(history[:-n])
        for part in ([[t] for t in history[-n:]] if one_by_one else [history[-n:]]):
            s.append_tokens(part)
        out.append(s.next_logits())
    return float(np.abs(out[0] - out[1]).max())


@pytest.fixture(scope="module")
def qwen05(qwen05_gguf: Path):
    m = Model.load(qwen05_gguf, n_ctx=2048, n_threads=2, n_threads_batch=2, n_seq_max=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def tiny(tiny_models):
    m = Model.load(tiny_models["text"], n_ctx=2048, n_threads=1, n_threads_batch=1, n_seq_max=2,
                   kv_type="f32")
    yield m
    m.close()


@pytest.mark.parametrize("action", ["zoom", "text_search", "image_search"])
def test_real_model_action_is_the_same_with_forced_text_in_one_batch(qwen05: Model, action: str) -> None:
    plain, batched = run_action(qwen05, action, forced=False), run_action(qwen05, action, forced=True)
    # Q4_K_M: a batch and token-by-token decoding differ in llama.cpp itself (~0.25 in a logit); the
    # verified batches may differ from plain decoding by as much, never in a token
    gap = batching_gap(qwen05, plain["history"], len(plain["tokens"]))
    print(f"{action}: gap {gap:.3f}, forced vs plain "
          f"{np.abs(batched['logits'] - plain['logits']).max():.3f}, "
          f"log-probs {np.abs(batched['logprobs'] - plain['logprobs']).max():.3f}")
    assert_same(plain, batched, atol=2 * gap)
    # the real model writes the forced text as its tokenizer does: it is verified and kept, fewer decodes
    # (a query is free text up to its closing quote, the stop; an image index is one token before the
    # forced "}", the stop, which plain decoding leaves pending: nothing to save there)
    if action == "zoom":
        assert batched["decodes"] < plain["decodes"], (plain["decodes"], batched["decodes"], plain["text"])
    else:
        assert batched["decodes"] == plain["decodes"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("action", ["zoom", "image_search"])
def test_tiny_model_action_is_the_same_with_forced_text_in_one_batch(tiny: Model, action: str,
                                                                    temperature: float) -> None:
    """Random weights rarely write the forced text as its tokenization: the draft's first differing token
    ends each check (its cells removed), and the model's own choice is kept instead."""
    assert_same(run_action(tiny, action, forced=False, temperature=temperature),
                run_action(tiny, action, forced=True, temperature=temperature))


def test_forced_text_comes_from_the_grammar(qwen05: Model) -> None:
    """The probe finds what the grammar forces (and nothing where the model chooses)."""
    from edge_agent.runtime import forced
    from edge_agent.runtime.sampling import Sampler

    probe = forced.probe_of(qwen05.tokenizer)
    assert {"]", ",", '"', " ", "0", "a", "\n"} <= set(probe.chars)
    with Sampler(qwen05.handle, grammar=tail_grammar("zoom", n_images=1), temperature=0.0, seed=0) as smp:
        assert smp.forced_text(probe.ids, probe.chars, 48) == ""  # a coordinate: the model's choice
        for t in qwen05.tokenize("1000", special=False):
            smp.accept(t)
        assert smp.forced_text(probe.ids, probe.chars, 48) == ", "  # no coordinate is longer than 1000
        for t in qwen05.tokenize(", 5, 6, 7", special=False):
            smp.accept(t)
        assert smp.forced_text(probe.ids, probe.chars, 48) == ""  # 7, 70 or 700
        for t in qwen05.tokenize('], "label": "sign', special=False):
            smp.accept(t)
        assert smp.forced_text(probe.ids, probe.chars, 48) == ""
        for t in qwen05.tokenize('"', special=False):
            smp.accept(t)
        # one image: idx 0, then the fixed rest (the grammar admits the model's own closing token)
        assert smp.forced_text(probe.ids, probe.chars, 48) == ', "img_idx": 0}}\n</tool_call>'
        # a draft ends with the generation's stop string: nothing after it is worth a place in the batch
        assert (forced.draft(smp, qwen05.tokenizer, probe, 64, (TAIL_STOP["zoom"],))
                == qwen05.tokenize(', "img_idx": 0}', special=False))
        assert forced.draft(smp, qwen05.tokenizer, probe, 64) == qwen05.tokenize(
            ', "img_idx": 0}}\n</tool_call>', special=False)


def test_tiny_model_drafts_are_kept_cut_and_refused(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """With drafts tried after every refusal, a zoom action sees every case: a draft kept whole (and the
    model's next token from its last row), a draft cut where the model chose otherwise, and one refused at
    its first token; the tokens are plain decoding's."""
    from edge_agent.runtime import forced

    calls: list[tuple[int, int]] = []
    real = forced.verify

    def spy(h: Any, sampler: Any, run: Any, tok: Any, pending: int, guess: list[int], p0: int,
            **kw: Any) -> Any:
        got = real(h, sampler, run, tok, pending, guess, p0, **kw)
        kept = got.n_kv - 1  # draft tokens kept (the pending token's cell is the first)
        calls.append((len(guess), kept))
        return got

    monkeypatch.setattr(forced, "verify", spy)
    assert_same(run_action(tiny, "zoom", forced=False),
                run_action(tiny, "zoom", forced=True, stop_when_refused=False))
    assert any(kept == n for n, kept in calls)  # whole
    assert any(0 < kept < n for n, kept in calls)  # cut
    assert any(kept == 0 for n, kept in calls)  # refused


def test_a_refused_draft_ends_drafting_for_the_rest_of_the_action(tiny: Model,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped, the first draft refused at its first token is the last draft of the generation (each
    refused batch costs more than a decode); the action is still plain decoding's."""
    from edge_agent.runtime import forced

    calls: list[int] = []
    real = forced.verify

    def spy(h: Any, sampler: Any, run: Any, tok: Any, pending: int, guess: list[int], p0: int,
            **kw: Any) -> Any:
        got = real(h, sampler, run, tok, pending, guess, p0, **kw)
        calls.append(got.n_kv - 1)
        return got

    monkeypatch.setattr(forced, "verify", spy)
    plain = run_action(tiny, "zoom", forced=False)
    shipped = run_action(tiny, "zoom", forced=True)
    assert_same(plain, shipped)
    assert calls and calls[-1] == 0 and all(kept > 0 for kept in calls[:-1])  # it stopped at the refusal
    n_shipped = len(calls)
    calls.clear()
    run_action(tiny, "zoom", forced=True, stop_when_refused=False)
    assert len(calls) > n_shipped  # drafts went on after the refusal
