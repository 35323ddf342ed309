"""SeProD on the real runtime: the tiny Qwen3-VL agent + tiny prophet (same tokenizer, different
weights, F32 weights and KV: exact comparisons), and SmolLM2-135M as both agent and prophet.

Invariants: tau = 0 accepts the whole draft; a tau above every score accepts nothing; the accepted
length and the scores equal a reference computed token by token from the two models' own
distributions; after acceptance the agent's state is the one evaluating the same tokens gives (same
next-token distribution, same greedy continuation); a tokenizer mismatch is refused before any model
loads; the hooks work inside real agent episodes (SSR and free-form, with and without images).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from edge_agent.agent import seprod
from edge_agent.agent.events import AnswerToken, DraftProposed, DraftVerified, FinalAnswer
from edge_agent.errors import ModelFileError

KW = dict(n_ctx=2048, n_threads=1, n_threads_batch=1)
SMOL_Q = "Describe the Eiffel Tower."  # a draft SmolLM2's two contexts partly disagree on
AGENT_PROMPT = "<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def png(color=(200, 30, 30), size=(64, 64)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_pair(tiny_models):
    from edge_agent.runtime import Model

    agent = Model.load(tiny_models["text"], tiny_models["mmproj"], kv_type="f32", **KW)
    prophet = Model.load(tiny_models["prophet"], tiny_models["mmproj"], kv_type="f32", **KW)
    yield agent, prophet
    prophet.close()
    agent.close()


@pytest.fixture(scope="module")
def smol_pair(smollm2_gguf):
    """SmolLM2 as both models: two separate loads of one file (two contexts, like two GGUFs)."""
    from edge_agent.runtime import Model

    # flash_attn="on": the runtime turns flash attention off on CPU by default (faster scoring), and
    # then a batched pass and token-by-token decoding differ by up to ~0.07 per token on Q4_1 weights;
    # with it on they agree to ~1e-8, which the token-by-token references below rely on.
    agent = Model.load(smollm2_gguf, flash_attn="on", **KW)
    prophet = Model.load(smollm2_gguf, flash_attn="on", **KW)
    yield agent, prophet
    prophet.close()
    agent.close()


@pytest.fixture(params=["tiny", "smollm2"])
def pair(request):
    return request.getfixturevalue("tiny_pair" if request.param == "tiny" else "smol_pair"), request.param


def make_drafter(prophet, agent, **kw):
    kw.setdefault("background", False)
    return seprod.Drafter(prophet, agent_vocab=agent.n_vocab, **kw)


def draft_for(pair_models, kind, draft_len=12):
    """A draft on the pair: tiny drafts about an image (grounding), SmolLM2 from the question alone."""
    agent, prophet = pair_models
    d = make_drafter(prophet, agent, draft_len=draft_len, tau=0.0)
    if kind == "tiny":
        dr = d.draft(seprod.GROUNDING, seprod.grounding_query("the red square"), png())
    else:
        dr = d.draft(seprod.ANSWERING, SMOL_Q, None)
    return d, dr


def agent_session(agent, kind):
    s = agent.session()
    if kind == "tiny":
        s.append_text("<|im_start|>user\n")
        s.append_image(png())
        s.append_text("Where is the red square?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    else:
        s.append_text(AGENT_PROMPT.format(q=SMOL_Q) + "<answer>")
    return s


def reference(pair_models, kind, draft, lead=()):
    """Token-by-token log p_s, ranks (agent) and log p_p (prophet) from full next-token distributions.
    ``lead``: whitespace the agent wrote itself before the draft (Verification.lead)."""
    agent, prophet = pair_models
    s = agent_session(agent, kind)
    if lead:
        s.append_tokens(list(lead))
    ls, ranks = [], []
    for t in draft.tokens:
        lp = s.next_logprobs().astype(np.float64)
        ls.append(lp[t])
        ranks.append(int(np.count_nonzero(lp > lp[t])))
        s.append_tokens([t])
    p = prophet.session()  # what the prophet sees: image (if any) + query, in a user turn
    p.append_text("<|im_start|>user\n")
    if kind == "tiny":
        p.append_image(png())
    p.append_text(draft.query, special=False)
    p.append_text("<|im_end|>\n<|im_start|>assistant\n")
    lpp = []
    for t in draft.tokens:
        lpp.append(float(p.next_logprobs()[t]))
        p.append_tokens([t])
    V = agent.n_vocab
    scores = []
    for j in range(len(draft.tokens)):
        a = 0.5 + 0.5 * (1 - math.log1p(ranks[j]) / math.log(V))  # a0 = 0.5, gamma = 1
        scores.append(math.exp(a * ls[j] + (1 - a) * lpp[j]))
    return np.array(ls), np.array(lpp), np.array(ranks), np.array(scores)


def test_tau_zero_accepts_all_and_tau_above_every_score_accepts_none(pair):
    """tau=0: the whole draft; tau above max s_j: nothing, and the agent's session is unchanged."""
    models, kind = pair
    agent, _ = models
    d, dr = draft_for(models, kind)
    try:
        assert len(dr.tokens) >= 4, dr
        s = agent_session(agent, kind)
        n0 = s.n_pos
        v = d.verify(s, dr)
        assert v.accepted == len(dr.tokens) and v.accepted_text == dr.text
        assert s.n_pos == n0 + len(v.lead) + len(dr.tokens)
        assert v.adopted == "adopted" and 1 not in s.kv_seq_ranges()  # no leftover candidate sequence
        top = float(v.scores.max())
        assert top < 1.0
        d.tau = min(1.0, top + 1e-6)
        s = agent_session(agent, kind)
        cp = s.checkpoint()
        v = d.verify(s, dr)  # only the agent's own greedy whitespace (if any) was written
        assert v.accepted == 0 and v.accepted_text == "" and s.n_pos == cp.n_pos + len(v.lead)
        assert set(s.kv_seq_ranges()) == {0}
    finally:
        d.close()


def test_accepted_length_and_scores_match_a_token_by_token_reference(pair):
    """s_j from one batched scoring pass == s_j from the two models' full distributions; the accepted
    length for a tau between two scores is the reference's."""
    models, kind = pair
    agent, _ = models
    d, dr = draft_for(models, kind)
    try:
        v = d.verify(agent_session(agent, kind), dr)
        ls, lpp, ranks, ref = reference(models, kind, dr, v.lead)
        tol = 1e-4 if kind == "tiny" else 0.05  # F32 exact; Q4_1 batch-shape summation order
        np.testing.assert_allclose(dr.logprobs, lpp, atol=tol)  # the drafter's p_p is the prophet's own
        np.testing.assert_allclose(v.logp_search, ls, atol=tol)
        if kind == "tiny":
            np.testing.assert_array_equal(v.ranks, ranks)
        np.testing.assert_allclose(v.scores, ref, atol=tol, rtol=tol)
        # a tau in the widest gap between consecutive reference scores (so tolerance cannot flip it),
        # among taus that cut the draft somewhere inside
        order = np.sort(ref)
        gaps = np.diff(order)
        i = int(np.argmax(gaps))
        tau = float(order[i] + gaps[i] / 2)
        expect = seprod.accepted_length(ref, tau)
        expect_loop = next((j for j, x in enumerate(ref) if x < tau), len(ref))
        assert expect == expect_loop
        d.tau = tau
        s = agent_session(agent, kind)
        v = d.verify(s, dr)
        assert v.accepted == expect
    finally:
        d.close()


@pytest.mark.parametrize("cut", ["partial", "all"])
def test_generation_after_acceptance_equals_generation_after_evaluating(pair, cut):
    """adopted draft tokens leave the agent exactly as evaluating them would: same next-token
    distribution, same greedy continuation, same position counter."""
    models, kind = pair
    agent, _ = models
    d, dr = draft_for(models, kind)
    try:
        if cut == "partial":  # tau between the first drop of the running minimum and that minimum
            sc = d.verify(agent_session(agent, kind), dr).scores
            k = next(j for j in range(1, len(sc)) if sc[j] < sc[:j].min())
            d.tau = float((sc[k] + sc[:k].min()) / 2)
        s = agent_session(agent, kind)
        v = d.verify(s, dr)
        assert (0 < v.accepted < len(dr.tokens)) if cut == "partial" else v.accepted == len(dr.tokens)
        lp_a = s.next_logprobs()
        g_a = s.generate(max_tokens=10)
        pos_a = s.n_pos

        s = agent_session(agent, kind)
        s.append_tokens(list(v.lead) + list(v.accepted_tokens))
        lp_b = s.next_logprobs()
        g_b = s.generate(max_tokens=10)
        tol = 1e-4 if kind == "tiny" else 0.05
        np.testing.assert_allclose(lp_a, lp_b, atol=tol)
        assert g_a.tokens == g_b.tokens and pos_a == s.n_pos
    finally:
        d.close()


def test_prophet_sees_the_image(tiny_pair):
    """a grounding draft depends on the crop the prophet is shown (the image reaches the prophet)."""
    agent, prophet = tiny_pair
    d = make_drafter(prophet, agent, draft_len=6)
    try:
        q = seprod.grounding_query("the sign")
        a = d.draft(seprod.GROUNDING, q, png((250, 250, 250), (96, 64)))
        b = d.draft(seprod.GROUNDING, q, png((0, 0, 0), (64, 96)))
        assert a.tokens != b.tokens or not np.allclose(a.logprobs, b.logprobs)
        again = d.draft(seprod.GROUNDING, q, png((250, 250, 250), (96, 64)))
        assert again.tokens == a.tokens and np.allclose(again.logprobs, a.logprobs, atol=1e-5)
    finally:
        d.close()


def test_background_drafting_gives_the_same_draft(tiny_pair):
    """a draft prepared in the worker thread while the agent evaluates equals a synchronous one."""
    agent, prophet = tiny_pair
    img = png()
    sync = make_drafter(prophet, agent, draft_len=8)
    try:
        ref = sync.draft(seprod.ANSWERING, "What colour?", img)
    finally:
        sync.close()
    d = make_drafter(prophet, agent, draft_len=8, background=True)
    try:
        d.start(image=img, question="What colour?")
        s = agent_session(agent, "tiny")  # the agent works meanwhile, on its own model
        got = d.draft(seprod.ANSWERING, "What colour?", img)
        assert got.tokens == ref.tokens
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
        assert d.verify(s, got).accepted >= 0
    finally:
        d.close()


def test_tokenizer_mismatch_is_refused_before_any_model_loads(tiny_models, smollm2_gguf, edge_home, monkeypatch):
    """Qwen3-VL agent + SmolLM2 prophet: ModelFileError naming both files, and Model.load never ran."""
    from edge_agent.config import Settings
    from edge_agent.engine import Engine
    from edge_agent.runtime.model import Model

    loads = []

    def no_load(cls, *a, **k):
        loads.append(a)
        raise AssertionError("a model was loaded before the tokenizer check")

    monkeypatch.setattr(Model, "load", classmethod(no_load))
    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "prophet": str(smollm2_gguf), "n_threads": 1, "n_threads_batch": 1})
    with pytest.raises(ModelFileError, match="tokenizer") as e:
        Engine.from_settings(settings)
    assert "SmolLM2" in e.value.message and not loads


# --------------------------------------------------------------------------------------------------
# inside real agent episodes
# --------------------------------------------------------------------------------------------------


def run_episode(agent, prophet, *, mode, image, tmp_path, tau=0.0, question="What colour is the square?"):
    """One question through the real Engine (offline search tools), SeProD on, zoom then answer."""
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.config import Settings
    from edge_agent.engine import Engine
    from edge_agent.tools.search import SearchTools

    settings = Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 8,
                              "freeform_max_tokens": 8, "max_turns": 2, "home": str(tmp_path)},
                             env={"EDGE_AGENT_HOME": str(tmp_path)})
    path = None
    if image:
        path = tmp_path / "photo.png"
        Image.new("RGB", (96, 64), (200, 30, 30)).save(path)

    def policy(turn, allowed):  # zoom in turn 1 when there is an image, then answer
        return {"zoom"} if (turn == 1 and image) else {"answer"}

    d = make_drafter(prophet, agent, draft_len=6, tau=tau, background=True)
    engine = Engine(agent, settings, tools=SearchTools.from_settings(settings), drafter=d)
    try:
        events = list(engine.ask(question, path, options=AgentOptions.from_settings(settings, mode=mode, policy=policy)))
        return events, engine._session
    finally:
        d.close()


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_episode_with_zoom_grounds_then_answers(tiny_pair, tmp_path, mode):
    """zoom -> next turn opens with an accepted grounding draft -> answer starts with the accepted
    answering draft; the answer text is the prophet's prefix + the agent's continuation."""
    agent, prophet = tiny_pair
    events, s = run_episode(agent, prophet, mode=mode, image=True, tmp_path=tmp_path)
    kinds = [e.kind for e in events]
    assert kinds.count("draft_proposed") == 2 and kinds.count("draft_verified") == 2, kinds
    props = [e for e in events if isinstance(e, DraftProposed)]
    vers = [e for e in events if isinstance(e, DraftVerified)]
    assert [p.mode for p in props] == ["grounding", "answering"] and all(v.turn == 2 for v in vers)
    assert all(v.accepted == v.drafted for v in vers)  # tau = 0
    final = events[-1]
    assert isinstance(final, FinalAnswer) and final.totals["seprod_drafts"] == 2
    from_prophet = [e for e in events if isinstance(e, AnswerToken) and e.from_prophet]
    if vers[1].accepted:
        assert from_prophet and final.answer.startswith(vers[1].accepted_text.strip())
    # the grounding text sits at the start of turn 2's think block, in the agent's own context
    if vers[0].accepted_text:
        assert "<think>\n" + vers[0].accepted_text in s.text()


def test_text_only_episode_smollm2(smol_pair, tmp_path):
    """no image: the prophet drafts from the question alone; the answer begins with what was accepted."""
    agent, prophet = smol_pair
    events, s = run_episode(agent, prophet, mode="ssr", image=False, tmp_path=tmp_path,
                            question="What is the capital of France?")
    props = [e for e in events if isinstance(e, DraftProposed)]
    assert [p.mode for p in props] == ["answering"] and props[0].tokens
    v = next(e for e in events if isinstance(e, DraftVerified))
    assert v.accepted == v.drafted and isinstance(events[-1], FinalAnswer)
    assert events[-1].answer.startswith(v.accepted_text.strip())


def ssr_answer_context(session, question):
    """The agent's context at an SSR answer: system prompt with tools, question, rationale, <answer>."""
    from edge_agent.agent.prompts import ANSWER_OPEN, THINK_CLOSE, question_segments, system_prompt

    session.append_text(system_prompt(["answer", "text_search"], has_image=False))
    for seg in question_segments(question, None):
        session.append_text(seg.text, special=seg.special)
    session.append_text("I should answer now from general knowledge." + THINK_CLOSE + ANSWER_OPEN)


def test_agent_lead_is_the_agents_own_greedy_whitespace(smol_pair):
    """In the real answer format SmolLM2 writes "\\n" after <answer>; the drafter lets the agent write it
    (exactly its greedy tokens) and scores the draft after it, so the draft is judged on content."""
    agent, prophet = smol_pair
    q = "Why is the sky blue?"
    d = make_drafter(prophet, agent, draft_len=8, tau=0.0)
    try:
        dr = d.draft(seprod.ANSWERING, q, None)
        s = agent.session()
        ssr_answer_context(s, q)
        v = d.verify(s, dr)
        assert v.lead and all(not agent.detokenize([t]).strip() for t in v.lead)
        s = agent.session()
        ssr_answer_context(s, q)
        assert s.generate(max_tokens=len(v.lead)).tokens == list(v.lead)
        d.agent_lead = 0
        s = agent.session()
        ssr_answer_context(s, q)
        v0 = d.verify(s, dr)
        assert v0.lead == () and v0.scores[0] < v.scores[0]  # without it the first token pays for the newline
    finally:
        d.close()


def test_ask_with_prophet_flags_streams_draft_events(tiny_models, edge_home, monkeypatch, tmp_path):
    """`edge-agent ask IMAGE Q --prophet P --prophet-mmproj M --json`: the prophet is loaded and its
    answering draft shows up as draft_proposed / draft_verified events before the final answer."""
    import json

    from click.testing import CliRunner

    from edge_agent.cli import cli

    for k, v in {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "4096", "ANSWER_MAX_TOKENS": "5",
                 "SEPROD_TAU": "0"}.items():
        monkeypatch.setenv(f"EDGE_AGENT_{k}", v)
    photo = tmp_path / "p.png"
    Image.new("RGB", (80, 60), (120, 40, 40)).save(photo)
    r = CliRunner().invoke(cli, ["ask", str(photo), "What colour is it?", "--model", str(tiny_models["text"]),
                                 "--mmproj", str(tiny_models["mmproj"]), "--prophet", str(tiny_models["prophet"]),
                                 "--prophet-mmproj", str(tiny_models["mmproj"]), "--offline", "--max-turns", "1",
                                 "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    kinds = [row["event"] for row in rows]
    assert rows[0]["seprod"] is True and "draft_verified" in kinds and kinds[-1] == "final_answer"
    dv = rows[kinds.index("draft_verified")]
    assert dv["accepted"] == dv["drafted"] and rows[-1]["totals"]["seprod_drafts"] >= 1


def test_engine_loads_the_prophet_and_reports_both_models_memory(tiny_models, edge_home):
    """--prophet with the same tokenizer: both models load, the progress says their memory, and
    Engine.memory() gives weights + KV cache bytes for each."""
    from edge_agent.config import Settings
    from edge_agent.engine import Engine

    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "prophet": str(tiny_models["prophet"]), "prophet_mmproj": str(tiny_models["mmproj"]),
                              "n_threads": 1, "n_threads_batch": 1, "n_ctx": 2048, "offline": True})
    said = []
    engine = Engine.from_settings(settings, progress=lambda msg, frac: said.append(msg))
    try:
        mem = engine.memory()
        assert set(mem) == {"agent", "prophet"}
        assert all(m["model"] > 0 and m["kv_cache"] > 0 for m in mem.values())
        line = next(m for m in said if m.startswith("Memory:"))
        assert "agent" in line and "prophet" in line and "MB" in line
        assert engine.drafter is not None and engine.drafter.draft_len == settings.seprod_draft_len
    finally:
        engine.close()
