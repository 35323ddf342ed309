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
import time

import numpy as np
import pytest
from PIL import Image

from edge_agent.agent import seprod, seprod_math, seprod_policy
from edge_agent.agent.events import AnswerToken, DraftProposed, DraftSkipped, DraftVerified, FinalAnswer
from edge_agent.core.errors import ModelFileError
from edge_agent.engine.face import AskRequest
from tests.test_seprod import run_hook

KW = dict(n_ctx=2048, n_threads=1, n_threads_batch=1)
SMOL_Q = "Describe the Eiffel Tower."  # a draft SmolLM2's two contexts partly disagree on
AGENT_PROMPT = ("<|im_start|>system\nYou answer "
                "briefly.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")


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
        dr = d.draft(seprod_math.GROUNDING, seprod_math.grounding_query("the red square"), png())
    else:
        dr = d.draft(seprod_math.ANSWERING, SMOL_Q, None)
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
        expect = seprod_math.accepted_length(ref, tau)
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
        q = seprod_math.grounding_query("the sign")
        a = d.draft(seprod_math.GROUNDING, q, png((250, 250, 250), (96, 64)))
        b = d.draft(seprod_math.GROUNDING, q, png((0, 0, 0), (64, 96)))
        assert a.tokens != b.tokens or not np.allclose(a.logprobs, b.logprobs)
        again = d.draft(seprod_math.GROUNDING, q, png((250, 250, 250), (96, 64)))
        assert again.tokens == a.tokens and np.allclose(again.logprobs, a.logprobs, atol=1e-5)
    finally:
        d.close()


def test_background_drafting_gives_the_same_draft(tiny_pair):
    """a draft prepared in the worker thread while the agent evaluates equals a synchronous one."""
    agent, prophet = tiny_pair
    img = png()
    sync = make_drafter(prophet, agent, draft_len=8)
    try:
        ref = sync.draft(seprod_math.ANSWERING, "What colour?", img)
    finally:
        sync.close()
    d = make_drafter(prophet, agent, draft_len=8, background=True)
    try:
        d.start(image=img, question="What colour?")
        s = agent_session(agent, "tiny")  # the agent works meanwhile, on its own model
        got = d.draft(seprod_math.ANSWERING, "What colour?", img)
        assert got.tokens == ref.tokens
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
        # and it verifies against the agent's session as the token-by-token reference says
        v = d.verify(s, got)
        *_, ref_scores = reference((agent, prophet), "tiny", got, v.lead)
        np.testing.assert_allclose(v.scores, ref_scores, atol=1e-4, rtol=1e-4)
        assert v.accepted == next((j for j, x in enumerate(ref_scores) if x < d.tau), len(ref_scores))
    finally:
        d.close()


def test_tokenizer_mismatch_is_refused_before_any_model_loads(tiny_models, smollm2_gguf, edge_home,
                                                              monkeypatch):
    """Qwen3-VL agent + SmolLM2 prophet: ModelFileError naming both files, and Model.load never ran."""
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine
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


def run_episode(agent, prophet, *, mode, image, tmp_path, tau=0.0, question="What colour is the square?",
                drafter=None, settings_extra=None, context=None):
    """One question through the real Engine (offline search tools), SeProD on, zoom then answer.
    The drafter blocks for its drafts (these tests check what drafts do, not when they are ready).
    ``context``: a previous answer's ``FinalAnswer.context`` (the same chat continues)."""
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine
    from edge_agent.tools.search import SearchTools

    settings = Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 8,
                              "freeform_max_tokens": 8, "max_turns": 2, "home": str(tmp_path),
                              **(settings_extra or {})},
                             env={"EDGE_AGENT_HOME": str(tmp_path)})
    path = None
    if image:
        path = tmp_path / "photo.png"
        Image.new("RGB", (96, 64), (200, 30, 30)).save(path)

    def policy(turn, allowed):  # zoom in turn 1 when there is an image, then answer
        return {"zoom"} if (turn == 1 and image) else {"answer"}

    d = drafter or make_drafter(prophet, agent, draft_len=6, tau=tau, background=True, block=True)
    engine = Engine(agent, settings, tools=SearchTools.from_settings(settings), drafter=d)
    try:
        opts = AgentOptions.from_settings(settings, mode=mode, policy=policy)
        events = list(engine.ask(AskRequest(question, path, context=context, options=opts)))
        return events, engine.contexts.live
    finally:
        if drafter is None:
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
    # tau = 0: the whole draft, and a draft is not empty
    assert all(0 < v.accepted == v.drafted for v in vers)
    grounding, answering = vers
    assert grounding.accepted_text.strip() and answering.accepted_text.strip()
    final = events[-1]
    assert isinstance(final, FinalAnswer) and final.totals["seprod_drafts"] == 2
    from_prophet = [e for e in events if isinstance(e, AnswerToken) and e.from_prophet]
    assert "".join(e.text for e in from_prophet).strip() == answering.accepted_text.strip()
    assert final.answer.startswith(answering.accepted_text.strip())
    # the grounding text sits at the start of turn 2's think block, in the agent's own context
    assert "<think>\n" + grounding.accepted_text in s.text()


def test_in_an_episode_the_agent_encodes_each_image_and_the_prophet_none(tiny_pair, tmp_path):
    """drafts start after the agent has read the question's image: the agent encodes it (an encode
    cannot be preempted: a prophet encoding first would make the agent wait for its one thread) and
    the prophet decodes the agent's embeddings, of the photo and of the crop."""
    from edge_agent.agent.events import ImageEvaluated
    from edge_agent.runtime import vision

    agent, prophet = tiny_pair
    vision.clear_cache()
    a0, p0 = agent.vision_encodes, prophet.vision_encodes
    events, _ = run_episode(agent, prophet, mode="ssr", image=True, tmp_path=tmp_path,
                            question="Which colour is this?")
    images = [e for e in events if isinstance(e, ImageEvaluated)]
    assert [e.source for e in images] == ["image", "crop"] and not any(e.reused for e in images)
    assert agent.vision_encodes - a0 == 2 and prophet.vision_encodes == p0
    assert events[-1].totals["seprod_drafts"] == 2  # and the prophet drafted on both


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
        dr = d.draft(seprod_math.ANSWERING, q, None)
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
    answering draft shows up as draft_proposed / draft_verified events before the final answer
    (seprod_adaptive false: the experiment setting, which waits for every draft; by default a draft
    not ready in time is skipped: test_seprod.py::test_nothing_measured_means_no_waiting)."""
    import json

    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    for k, v in {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "4096", "ANSWER_MAX_TOKENS": "5",
                 "SEPROD_TAU": "0", "SEPROD_ADAPTIVE": "false"}.items():
        monkeypatch.setenv(f"EDGE_AGENT_{k}", v)
    photo = tmp_path / "p.png"
    Image.new("RGB", (80, 60), (120, 40, 40)).save(photo)
    r = CliRunner().invoke(cli, ["ask", str(photo), "What colour is it?", "--model", str(tiny_models["text"]),
                                 "--mmproj", str(tiny_models["mmproj"]), "--prophet",
                                 str(tiny_models["prophet"]),
                                 "--prophet-mmproj", str(tiny_models["mmproj"]), "--offline", "--max-turns",
                                 "1",
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
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine

    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "prophet": str(tiny_models["prophet"]),
                              "prophet_mmproj": str(tiny_models["mmproj"]),
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


# --------------------------------------------------------------------------------------------------
# issue 13: the answer budget, drafts that never block, adaptive drafting, the grounding verdict
# --------------------------------------------------------------------------------------------------


def test_accepted_draft_tokens_count_against_answer_max_tokens(smol_pair, tmp_path):
    """L_d 16 > answer_max_tokens 8, tau 0 (everything acceptable): the answer has at most 8 tokens,
    the accepted draft and the agent's lead included, and ``answer_tokens`` says how many."""
    agent, prophet = smol_pair
    d = make_drafter(prophet, agent, draft_len=16, tau=0.0, background=True, block=True)
    try:
        events, _ = run_episode(agent, prophet, mode="ssr", image=False, tmp_path=tmp_path, drafter=d,
                                question="Describe the Eiffel Tower in a few sentences.")
    finally:
        d.close()
    v = next(e for e in events if isinstance(e, DraftVerified))
    final = events[-1]
    assert isinstance(final, FinalAnswer)
    assert 0 < v.accepted and v.lead + v.accepted <= 8 and v.drafted <= 8 - v.lead
    assert final.totals["answer_tokens"] <= 8 and final.totals["answer_tokens"] >= v.lead + v.accepted
    assert final.answer.startswith(v.accepted_text.strip())


def test_a_draft_not_ready_is_skipped_and_the_prophet_stops(smol_pair):
    """the agent reaches the answer while the prophet is still drafting and a token of the agent is
    priced far below the draft's remaining time: the agent goes on at once (DraftSkipped, its session
    untouched), the prophet's draft is cancelled, and the prophet drafts correctly afterwards."""
    agent, prophet = smol_pair
    q = "Why is the sky blue?"
    ref_d = make_drafter(prophet, agent, draft_len=16, tau=0.05)
    try:
        ref = ref_d.draft(seprod_math.ANSWERING, q, None)
    finally:
        ref_d.close()
    d = make_drafter(prophet, agent, draft_len=16, tau=0.05, background=True)
    try:
        d.costs.agent_token, d.costs.prophet_token, d.costs.prefill_new_image = 1e-6, 0.5, 0.5
        s = agent.session()
        ssr_answer_context(s, q)
        n0 = s.n_pos
        d.start(image=None, question=q)
        t0 = time.perf_counter()
        events, v = run_hook(d.answer(s, turn=1, image=None, question=q))
        assert time.perf_counter() - t0 < 0.2
        assert [type(e) for e in events] == [DraftSkipped] and events[0].reason == "not_ready"
        assert v.accepted == 0 and s.n_pos == n0
        d.wait_idle(timeout=30)  # the worker is free: the draft was cancelled
        assert d.stats.totals()["seprod_skipped_not_ready"] == 1
        again = d.draft(seprod_math.ANSWERING, q, None)  # the prophet's session is still usable
        assert again.tokens == ref.tokens
    finally:
        d.close()


def test_a_ready_draft_is_used_without_waiting(smol_pair):
    agent, prophet = smol_pair
    q = "What is photosynthesis?"
    d = make_drafter(prophet, agent, draft_len=8, tau=0.05, background=True)
    try:
        d.draft(seprod_math.ANSWERING, "Hello?", None)  # a prophet's first draft is not measured (cold)
        d.start(image=None, question=q)
        d.wait_idle(timeout=60)  # the prepared draft is drafted (and stays prepared for its hook)
        assert (seprod_math.ANSWERING, q, "") in d.prepared()
        s = agent.session()
        ssr_answer_context(s, q)
        events, v = run_hook(d.answer(s, turn=1, image=None, question=q))
        prop = next(e for e in events if isinstance(e, DraftProposed))
        assert prop.waited < 0.05 and prop.tokens and not v.skipped
        assert d.costs.prophet_token is not None and d.costs.prophet_token > 0  # measured on the way
    finally:
        d.close()


def test_a_mode_whose_drafts_are_rejected_stops_drafting_in_the_chat(tiny_pair, tmp_path):
    """tau 1 (no draft token can pass): after two rejected answering drafts in a chat, the third
    question does not draft at all (DraftSkipped low_acceptance, the prophet evaluates nothing)."""
    agent, prophet = tiny_pair
    d = make_drafter(prophet, agent, draft_len=6, tau=1.0, background=True, block=True)
    try:
        context = None
        for q in ("What colour is it?", "Is it square?"):  # one chat: each question continues the last
            events, _ = run_episode(agent, prophet, mode="ssr", image=False, tmp_path=tmp_path, drafter=d,
                                    question=q,
                                    context=context)
            assert any(isinstance(e, DraftVerified) and e.accepted == 0 for e in events)
            context = events[-1].context
            assert context
        before = d.tokens_evaluated
        events, _ = run_episode(agent, prophet, mode="ssr", image=False, tmp_path=tmp_path, drafter=d,
                                question="How big is it?", context=context)
        skips = [e for e in events if isinstance(e, DraftSkipped)]
        assert [e.reason for e in skips] == ["low_acceptance"] and "below break-even" in skips[0].detail
        assert not any(isinstance(e, DraftProposed) for e in events) and d.tokens_evaluated == before
        assert events[-1].totals["seprod_skipped_low_acceptance"] == 1
        events, _ = run_episode(agent, prophet, mode="ssr", image=False, tmp_path=tmp_path, drafter=d,
                                question="How big is it?")  # a new chat starts afresh: it drafts again
        assert any(isinstance(e, DraftVerified) for e in events)
    finally:
        d.close()


class ScriptedDrafter(seprod.Drafter):
    """The real drafter with the prophet's output fixed (its text in the agent's tokens, p_p = 1), and
    the queries it was asked recorded: for what the verdict does, independent of random weights."""

    def __init__(self, agent, script, **kw):
        super().__init__(agent, agent_vocab=agent.n_vocab, background=True, block=True, **kw)
        self.script = script  # mode -> text
        self.queries = []

    def _draft_now(self, job):
        self.queries.append((job.mode, job.query))
        toks = tuple(self.prophet.tokenize(self.script[job.mode], special=False))
        return seprod_math.Draft(job.mode, job.query, toks, np.zeros(len(toks)),
                                 self.prophet.detokenize(toks), 0.0,
                            draft_len=job.plan.draft_len)


def test_an_accepted_no_verdict_steers_the_next_turn_elsewhere(tiny_pair, tmp_path):
    """after a zoom, the prophet (asked about the zoom label the agent wrote) says "No, ...": the
    verdict is parsed and shown, and the agent's think block holds the accepted text and then the
    steer to look elsewhere, before the SSR rationales are scored."""
    agent, _ = tiny_pair
    d = ScriptedDrafter(agent,
                        {seprod_math.GROUNDING: "No, there is no sign here.", seprod_math.ANSWERING: "Red"},
                        tau=0.0, draft_len=16)
    try:
        events, s = run_episode(agent, None, mode="ssr", image=True, tmp_path=tmp_path, drafter=d)
    finally:
        d.close()
    zoom = next(e for e in events if e.kind == "tool_called")
    label = zoom.arguments.get("label", "")  # random weights: whatever the agent wrote, cleaned
    asked = [q for m, q in d.queries if m == seprod_math.GROUNDING]
    assert asked == [seprod_math.grounding_query(label or "What colour is the square?")]
    if seprod_math.clean_label(label):
        assert seprod_math.clean_label(label) in asked[0]
    ver = next(e for e in events if isinstance(e, DraftVerified) and e.mode == "grounding")
    assert ver.verdict == "no" and ver.verdict_accepted
    assert "<think>\nNo, there is no sign here." + seprod_math.STEER_ELSEWHERE in s.text()
    i = [e.kind for e in events].index("draft_verified")
    assert [e.kind for e in events][i + 1] == "rationale_scored"


def test_engine_gives_the_prophet_the_cores_the_agent_leaves(tiny_models, edge_home):
    """thread counts per model chosen for the machine: the prophet gets seprod_policy.prophet_threads(...)."""
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine
    from edge_agent.runtime.cores import physical_cores

    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "prophet": str(tiny_models["prophet"]),
                              "prophet_mmproj": str(tiny_models["mmproj"]),
                              "n_ctx": 2048, "offline": True})
    engine = Engine.from_settings(settings)
    try:
        n = seprod_policy.prophet_threads(engine.model.n_threads, physical_cores())
        assert engine.prophet.n_threads == n and engine.prophet.n_threads_batch == n
        assert engine.prophet.n_threads + engine.model.n_threads <= max(2, physical_cores())
        assert engine.drafter.adaptive.enabled and engine.drafter.tau == settings.seprod_tau
        # the two compute within one share of the machine's cores: the agent in front (runtime.cores)
        assert engine.model.handle.cores is engine.prophet.handle.cores is not None
        assert engine.model.handle.cores.cores == physical_cores()
        assert (engine.model.handle.role, engine.prophet.handle.role) == ("foreground", "background")
    finally:
        engine.close()


# --------------------------------------------------------------------------------------------------
# issue 13 item 1: one vision encode per image when agent and prophet share the mmproj file
# --------------------------------------------------------------------------------------------------


def test_prophet_decodes_the_agents_image_embedding_with_the_same_draft(tiny_pair):
    """same mmproj bytes: the prophet reuses the embedding the agent's encode produced (no encode of
    its own), and the draft, its log-probs, the scores and the accepted length are those of a
    prophet that encoded the image itself."""
    from edge_agent.runtime import vision

    agent, prophet = tiny_pair
    img = png((20, 160, 40), (96, 64))  # no other test uses this image
    q = seprod_math.grounding_query("the green square")

    def agent_ctx():
        s = agent.session()
        s.append_text("<|im_start|>user\n")
        s.append_image(img)
        s.append_text("Where is the green square?<|im_end|>\n<|im_start|>assistant\n<think>\n")
        return s

    vision.clear_cache()
    own = make_drafter(prophet, agent, draft_len=10, tau=0.05)
    try:
        p0, total0 = prophet.vision_encodes, vision.vision_encodes()
        ref = own.draft(seprod_math.GROUNDING, q, img)  # the prophet encodes the image itself
        assert prophet.vision_encodes == p0 + 1 and vision.vision_encodes() == total0 + 1
        ref_v = own.verify(agent_ctx(), ref)
    finally:
        own.close()

    vision.clear_cache()
    shared = make_drafter(prophet, agent, draft_len=10, tau=0.05)
    try:
        a0, p0, total0 = agent.vision_encodes, prophet.vision_encodes, vision.vision_encodes()
        s = agent_ctx()  # the agent encodes the image: the one encode
        got = shared.draft(seprod_math.GROUNDING, q, img)  # the prophet decodes the agent's embedding
        assert agent.vision_encodes == a0 + 1 and prophet.vision_encodes == p0
        assert vision.vision_encodes() == total0 + 1
        assert got.tokens == ref.tokens and got.text == ref.text
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-6)
        v = shared.verify(s, got)
        assert v.accepted == ref_v.accepted
        np.testing.assert_allclose(v.scores, ref_v.scores, atol=1e-6)
    finally:
        shared.close()


def test_an_episode_encodes_each_image_once(tiny_pair, tmp_path):
    """through the engine (question image, then a zoomed crop): agent and prophet together run one
    vision encode per distinct image, while the prophet drafts in the background."""
    from edge_agent.runtime import vision

    agent, prophet = tiny_pair
    vision.clear_cache()
    a0, p0 = agent.vision_encodes, prophet.vision_encodes
    d = make_drafter(prophet, agent, draft_len=6, tau=0.0, background=True, block=True)
    try:
        events, _ = run_episode(agent, prophet, mode="ssr", image=True, tmp_path=tmp_path, drafter=d)
    finally:
        d.close()
    assert [e.mode for e in events if isinstance(e, DraftProposed)] == ["grounding", "answering"]
    images = 2  # the question's image and one crop
    assert (agent.vision_encodes - a0) + (prophet.vision_encodes - p0) == images


def test_agent_and_prophet_reading_one_image_at_once_encode_it_once(tiny_pair):
    """the agent and the prophet put the same image into their contexts at the same moment (the
    prophet drafts while the agent reads the question): one vision encode, the other model waits for it."""
    import threading

    from edge_agent.runtime import vision

    agent, prophet = tiny_pair
    img = png((90, 20, 160), (128, 96))
    vision.clear_cache()
    a0, p0 = agent.vision_encodes, prophet.vision_encodes
    go = threading.Barrier(2)
    errors = []

    def read(model):
        try:
            s = model.session()
            s.append_text("<|im_start|>user\n")
            go.wait()
            s.append_image(img)
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(m,)) for m in (agent, prophet)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert (agent.vision_encodes - a0) + (prophet.vision_encodes - p0) == 1



def test_a_draft_verified_after_the_answers_start_equals_evaluating_from_scratch(pair):
    """After the answer check (``written``: the answer's first tokens, the agent's own, already in the
    context), the rest of a draft that begins with them is scored after them and adopted: the context then
    holds the answer's start followed by the draft's rest, with the positions, history and next-token
    distribution of a fresh session evaluating the same tokens after the same context."""
    models, kind = pair
    agent, prophet = models
    q, image = ("Where is the red square?", png()) if kind == "tiny" else (SMOL_Q, None)
    d = make_drafter(prophet, agent, draft_len=8, tau=0.0)
    try:
        dr = d.draft(seprod_math.ANSWERING, q, image)
        assert len(dr.tokens) > 3, dr
        written = tuple(dr.tokens[:2])  # as the answer check would have decoded them
        s = agent_session(agent, kind)
        n_context = len(s.history)
        s.append_tokens(written)
        events, v = run_hook(d.answer(s, turn=1, image=image, question=q, written=written))
        assert [type(e) for e in events] == [DraftProposed, DraftVerified, AnswerToken]
        assert events[0].tokens == dr.tokens[2:] and v.accepted == len(dr.tokens) - 2  # tau 0: all of it
        answer = list(s.history)[n_context:]
        assert answer == list(written) + list(v.lead) + list(dr.tokens[2:])
        after, n_pos = s.next_logprobs(), s.n_pos
        fresh = agent_session(agent, kind)  # (s is replaced: one context per model)
        fresh.append_tokens(answer)
        assert fresh.n_pos == n_pos
        tol = 1e-4 if kind == "tiny" else 0.05  # F32 exact; Q4_1 batch-shape summation order
        np.testing.assert_allclose(after, fresh.next_logprobs(), atol=tol)
    finally:
        d.close()
