"""Greedy decoding under a grammar checks the top candidates before masking the whole vocabulary
(``Sampler._best_allowed``): it must pick exactly the masked argmax (real grammar sampler, tiny model)."""

from __future__ import annotations

import numpy as np

from edge_agent.agent.actions import tail_grammar


def test_top_candidates_give_the_masked_argmax(tiny_models) -> None:
    from edge_agent.runtime import Model
    from edge_agent.runtime.sampling import TOP_K, Sampler

    rng = np.random.default_rng(0)
    with Model.load(tiny_models["text"], n_ctx=256) as m:
        assert TOP_K < m.n_vocab
        fast = 0
        for trial in range(60):
            logits = rng.standard_normal(m.n_vocab).astype(np.float32)
            if trial % 3 == 0:  # ties at the top: the lowest id wins, as np.argmax
                logits[rng.integers(0, m.n_vocab, 5)] = logits.max() + 1
            with Sampler(m.handle, grammar=tail_grammar("zoom"), temperature=0.0, seed=0) as smp:
                for prefix in ([], m.tokenize("12", special=False)):
                    for t in prefix:
                        smp.accept(t)
                    want = int(np.argmax(smp._mask(logits)))
                    got = smp.sample(logits)
                    assert got == want
                    fast += smp._best_allowed(logits) is not None
        assert fast > 0  # the fast path was taken (and agreed with the full mask)


def test_sampling_under_a_grammar_only_returns_allowed_tokens(tiny_models) -> None:
    from edge_agent.runtime import Model
    from edge_agent.runtime.sampling import Sampler

    rng = np.random.default_rng(1)
    with Model.load(tiny_models["text"], n_ctx=256) as m, \
            Sampler(m.handle, grammar=tail_grammar("zoom"), temperature=1.0, seed=3) as smp:
        for _ in range(30):
            tok = smp.sample(rng.standard_normal(m.n_vocab).astype(np.float32))
            assert np.isfinite(smp._mask(np.zeros(m.n_vocab, dtype=np.float32))[tok])


def test_larger_windows_give_the_masked_argmax_at_qwens_vocabulary(qwen05_gguf) -> None:
    """At 151,936 tokens, random logits put a coordinate's few allowed tokens far below the top 64: the
    larger windows find the masked argmax (exactly), and the whole row is masked less often."""
    from edge_agent.runtime import Model, sampling
    from edge_agent.runtime.sampling import Sampler

    rng = np.random.default_rng(5)
    used = {k: 0 for k in sampling.WINDOWS}
    real = sampling.Sampler._apply

    def counting(self: Sampler, data: np.ndarray) -> None:
        used[len(data)] = used.get(len(data), 0) + 1
        real(self, data)

    with Model.load(qwen05_gguf, n_ctx=256, n_seq_max=1) as m:
        for _ in range(12):
            logits = rng.standard_normal(m.n_vocab).astype(np.float32)
            with Sampler(m.handle, grammar=tail_grammar("zoom"), temperature=0.0, seed=0) as smp:
                for prefix in ([], m.tokenize("12", special=False),
                               m.tokenize(', 5, 6, 7], "label": "', special=False)):
                    for t in prefix:
                        smp.accept(t)
                    want = int(np.argmax(smp._mask(logits)))
                    sampling.Sampler._apply = counting  # type: ignore[method-assign]
                    try:
                        got = smp.sample(logits)
                    finally:
                        sampling.Sampler._apply = real  # type: ignore[method-assign]
                    assert got == want
    assert used[2048] + used[32768] > 0  # the larger windows were needed, and agreed with the full mask


def grammar_taker(m, grammar: str):
    """Whether ``grammar`` (the real grammar sampler on model ``m``) takes a text char by char."""
    from edge_agent.runtime import forced
    from edge_agent.runtime.sampling import Sampler

    probe = forced.probe_of(m.tokenizer)
    ids = dict(zip(probe.chars, probe.ids.tolist(), strict=True))

    def allowed(text: str) -> bool:
        with Sampler(m.handle, grammar=grammar, temperature=0.0, seed=0) as smp:
            for c in text:
                if not smp._allows(ids[c]):
                    return False
                smp.accept(ids[c])
            return True

    return allowed


def test_a_query_is_a_few_words_without_commas(tiny_models) -> None:
    """text_search's grammar (real grammar sampler): at most MAX_QUERY_WORDS words, one space between
    them, no comma (the 1.5B's unbounded queries ran to comma-separated lists), then the closing quote."""
    from edge_agent.agent.actions import MAX_QUERY_WORDS, tail_cut
    from edge_agent.runtime import Model

    with Model.load(tiny_models["text"], n_ctx=256) as m:
        allowed = grammar_taker(m, tail_grammar("text_search"))

        assert allowed('highest point of Nepal"')
        assert allowed("Bosnia-Herzegovina's .ba top-level-domain?")
        assert not allowed("capital of Peru,")  # a list of queries starts with a comma
        assert not allowed(" capital")  # a query starts with a word
        assert not allowed("capital  of")  # one space between words
        assert not allowed('"')  # not empty
        words = " ".join(["word"] * MAX_QUERY_WORDS)
        assert allowed(words + '"')
        # the start of one word more is sampled (not masked into the eighth), then cut by tail_cut
        assert allowed(words + " ") and not allowed(words + " word ")
        cut = tail_cut("text_search")
        assert cut is not None and not cut(words) and cut(words + " ") and cut(words + " word")
        assert tail_cut("zoom") is None
        assert not allowed("x" * 25)  # a word of at most 24 characters


def test_an_answer_never_begins_with_a_brace(tiny_models) -> None:
    """The answer's grammar (real grammar sampler): prose never beginning with "{" (the 1.5B wrote tool calls
    of its own invention as answers: `{"name": "multiply", ...}`); a brace later is text. A "<" is text
    when no tag can start there: "if n <= 1", "x < 5", "a << 2" (without any "<", the 1.5B's prime test
    ended at "if n"), never "<" and a letter, "</" (the close's start) or "<|"."""
    from edge_agent.runtime import Model
    from edge_agent.tools.specs.answer import AFTER_LT

    with Model.load(tiny_models["text"], n_ctx=256) as m:
        allowed = grammar_taker(m, tail_grammar("answer"))

        assert allowed("Lima is the capital of Peru.</answer>") and allowed("</answer>")
        assert allowed("  12 * 34 = 408") and allowed("The set {1, 2} has two members.")
        assert not allowed('{"name": "multiply"') and not allowed("  {") and not allowed("Lima<b")
        assert allowed("    if n <= 1:\n        return False</answer>")
        assert allowed("x < 5 and a << 2</answer>")
        assert allowed("<= 5</answer>") and allowed("3<4</answer>")
        for tag in ("<tool_call>", "<|im_end|>", "<think>", "x </think>", "a <<b", "a </tool_call>"):
            assert not allowed(tag), tag
        assert not allowed("5 </answer> and on")  # "</" is the close: nothing follows it
        # the rest of an answer whose start ended in "<" (the answer check's tokens): what may follow one
        after = grammar_taker(m, AFTER_LT)
        assert allowed("if n <") and after("= 1: pass</answer>") and after("< 2</answer>")
        assert not after("/answer>") and not after("tool_call>") and not after("|im_end|>")
