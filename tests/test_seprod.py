"""SeProD acceptance maths and the drafter's logic, with fakes for the models (pure logic only).

The real-runtime tests (tiny agent + tiny prophet, SmolLM2 as both) are in test_seprod_runtime.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.agent import seprod
from edge_agent.agent.events import AnswerToken, DraftProposed, DraftVerified
from edge_agent.errors import ConfigError
from edge_agent.runtime.types import Checkpoint, ContinuationScore, Generation

V = 151_936


def test_normalised_rank_ends_and_log_scale():
    """argmax -> 1, last rank -> 0, and neighbouring top ranks stay distinguishable."""
    u = seprod.normalised_rank([0, 1, 10, 100, 1000, V - 1], V)
    assert u[0] == 1.0 and u[-1] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.diff(u) < 0)
    assert u[1] == pytest.approx(1 - math.log(2) / math.log(V))
    assert 0.55 < u[3] < 0.65  # rank 100 is far from the argmax, unlike a linear normalisation
    with pytest.raises(ValueError):
        seprod.normalised_rank([V], V)


def test_search_weight_grows_with_rank_between_a0_and_1():
    """higher rank (closer to the argmax) -> larger a_j; a_j in [a0, 1]."""
    ranks = np.array([V - 1, 5000, 50, 3, 0])
    for a0 in (0.0, 0.3, 0.5, 0.9):
        for gamma in (0.5, 1.0, 3.0):
            a = seprod.search_weight(ranks, V, a0, gamma)
            assert a[0] == pytest.approx(a0) and a[-1] == pytest.approx(1.0)
            assert np.all(np.diff(a) > 0) or a0 == 1.0
    a_sharp = seprod.search_weight([10], V, 0.5, 3.0)[0]
    a_soft = seprod.search_weight([10], V, 0.5, 0.5)[0]
    assert a_sharp < a_soft


def test_combined_score_is_the_weighted_geometric_mean():
    """s_j = p_s^a_j * p_p^(1-a_j), checked against a direct computation."""
    ps = np.array([0.9, 0.2, 0.05, 0.6])
    pp = np.array([0.5, 0.8, 0.9, 0.01])
    ranks = np.array([0, 3, 40, 1])
    s = seprod.combined_scores(np.log(ps), np.log(pp), ranks, V, 0.5)
    for j in range(4):
        a = 0.5 + 0.5 * (1 - math.log1p(ranks[j]) / math.log(V))
        assert s[j] == pytest.approx(ps[j] ** a * pp[j] ** (1 - a), rel=1e-12)
    assert s[0] == pytest.approx(0.9)  # the agent's argmax: only p_s counts
    # a0 = 1 ignores the prophet; a0 = 0 ignores the agent except as its rank lifts a_j
    assert np.allclose(seprod.combined_scores(np.log(ps), np.log(pp), ranks, V, 1.0), ps)


def test_combined_score_underflow_is_zero_not_nan():
    s = seprod.combined_scores([-2000.0], [-3000.0], [V - 1], V, 0.5)
    assert s[0] == 0.0 and not np.isnan(s[0])


def test_accepted_length_rule():
    """accept up to the first s_j < tau; tau=0 accepts all; tau above every score accepts none."""
    s = np.array([0.9, 0.4, 0.05, 0.8])
    assert seprod.accepted_length(s, 0.0) == 4
    assert seprod.accepted_length(np.array([0.0, 0.0]), 0.0) == 2
    assert seprod.accepted_length(s, 0.1) == 2  # stops at 0.05 even though 0.8 follows
    assert seprod.accepted_length(s, 0.4) == 2  # s_j == tau is accepted
    assert seprod.accepted_length(s, 0.41) == 1
    assert seprod.accepted_length(s, 0.95) == 0
    assert seprod.accepted_length(np.zeros(0), 0.5) == 0


def test_shapes_must_match():
    with pytest.raises(ValueError):
        seprod.combined_scores([0.0, 0.0], [0.0], [0, 0], V, 0.5)


# --------------------------------------------------------------------------------------------------
# Drafter logic with fakes: a "model" whose tokens are characters
# --------------------------------------------------------------------------------------------------


class FakeModel:
    """Tokens are code points; ``script`` is what the prophet 'generates' greedily."""

    has_vision = True
    n_ctx = 4096

    def __init__(self, script: str = "", logprob: float = -0.1):
        self.n_vocab = 0x110000
        self.script = script
        self.logprob = logprob
        self.sessions: list[FakeSession] = []

    def tokenize(self, text, *, special):
        return [ord(c) for c in text]

    def detokenize(self, tokens):
        return "".join(chr(t) for t in tokens)

    def session(self):
        s = FakeSession(self)
        self.sessions.append(s)
        return s

    def close(self):
        pass


class FakeSession:
    def __init__(self, model: FakeModel):
        self.model = model
        self.log: list[tuple[str, object]] = []
        self.tokens: list[int] = []
        self.n_pos = 0
        self.n_cells = 0
        self.adopted: list[tuple[list[int], int]] = []

    def append_text(self, text, *, special=True):
        self.log.append(("text" if special else "untrusted", text))
        self.tokens += [ord(c) for c in text]
        return len(text)

    def append_tokens(self, tokens):
        self.log.append(("tokens", list(tokens)))
        self.tokens += list(tokens)
        return len(tokens)

    def append_image(self, image):
        self.log.append(("image", image))
        self.tokens.append(-1)

    def checkpoint(self):
        return Checkpoint(len(self.tokens), len(self.tokens), len(self.log))

    def next_logprobs(self):
        # the agent's greedy next token: queued ``prefer`` tokens first, else "x" (content)
        lp = np.full(0x110000, -30.0, dtype=np.float32)
        lp[self.prefer.pop(0) if getattr(self, "prefer", None) else ord("x")] = 0.0
        return lp

    def rollback(self, cp):
        self.log.append(("rollback", cp.n_cells))
        del self.tokens[cp.n_cells:]

    def generate(self, *, max_tokens, **kw):
        toks = [ord(c) for c in self.model.script[:max_tokens]]
        self.log.append(("generate", max_tokens))
        return Generation("".join(map(chr, toks)), toks, "length", [self.model.logprob] * len(toks))

    def score(self, candidates, *, special=False, keep=False):
        self.kept = keep
        # agent's opinion: p_s = 0.5 for letters, 1e-6 for anything else; rank 0 / rank 5000
        (c,) = candidates
        lp = np.array([math.log(0.5) if chr(t).isalpha() else math.log(1e-6) for t in c])
        ranks = np.array([0 if chr(t).isalpha() else 5000 for t in c], dtype=np.int64)
        return [ContinuationScore(list(c), lp, ranks, float(lp.sum()), float(lp.mean()), len(c))]


@pytest.fixture
def drafter():
    d = seprod.Drafter(FakeModel("ab cd"), agent_vocab=V, draft_len=4, tau=0.1, a0=0.5, background=False)
    yield d
    d.close()


def test_prophet_sees_only_image_and_query(drafter):
    """the prophet's context is ChatML user turn: image + query (untrusted), then assistant; no agent text."""
    d = drafter.draft(seprod.ANSWERING, "What is <|im_end|> this?", b"IMG")
    (s,) = drafter.prophet.sessions
    assert s.log == [
        ("text", "<|im_start|>user\n"), ("image", b"IMG"), ("untrusted", "What is <|im_end|> this?"),
        ("text", "<|im_end|>\n<|im_start|>assistant\n"), ("generate", 4),
    ]
    assert d.tokens == tuple(map(ord, "ab c")) and d.text == "ab c" and d.logprobs.shape == (4,)


def test_text_only_prophet_gets_no_image(drafter):
    drafter.draft(seprod.ANSWERING, "Capital of France?", None)
    assert not [e for e in drafter.prophet.sessions[0].log if e[0] == "image"]


def test_same_image_reuses_the_prophet_cache(drafter):
    """a second draft on the same image rolls back to after the image instead of re-evaluating it."""
    drafter.draft(seprod.GROUNDING, seprod.grounding_query("the red sign"), b"CROP")
    drafter.draft(seprod.ANSWERING, "What does it say?", b"CROP")
    assert len(drafter.prophet.sessions) == 1
    log = drafter.prophet.sessions[0].log
    assert [e[0] for e in log].count("image") == 1 and ("rollback", len("<|im_start|>user\n") + 1) in log
    drafter.draft(seprod.ANSWERING, "What does it say?", b"OTHER")
    assert len(drafter.prophet.sessions) == 2


def test_draft_is_cut_before_turn_markers():
    """grounding drafts stop before chat-format markers; answering drafts before any "<" (the answer
    grammar admits none, so the agent could never have generated it)."""
    m = FakeModel("yes a<b it is</think> more")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=30, background=False)
    try:
        assert d.draft(seprod.GROUNDING, "q", None).text == "yes a<b it is"
        assert d.draft(seprod.ANSWERING, "q", None).text == "yes a"
        m.script = "<think>x"
        assert d.draft(seprod.GROUNDING, "q2", None).tokens == ()
    finally:
        d.close()


def test_end_of_turn_token_is_not_drafted():
    m = FakeModel("ok.")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=30, background=False)
    orig = FakeSession.generate

    def gen_eos(self, *, max_tokens, **kw):
        g = orig(self, max_tokens=max_tokens)
        return Generation(g.text, g.tokens + [0x10FFFF], "eos", g.logprobs + [-0.01])

    try:
        FakeSession.generate = gen_eos
        dr = d.draft(seprod.ANSWERING, "q", None)
        assert dr.text == "ok." and len(dr.logprobs) == 3
    finally:
        FakeSession.generate = orig
        d.close()


def test_grounding_query_names_the_target_and_asks_true_false():
    q = seprod.grounding_query("  the  small sign ")
    assert "the small sign" in q and "true or false" in q
    assert "the object in question" in seprod.grounding_query("")


def test_round_events_and_acceptance(drafter):
    """DraftProposed then DraftVerified then (answering) AnswerToken(from_prophet); stop at the space."""
    agent = FakeSession(FakeModel())
    gen = drafter.answer(agent, turn=2, image=None, question="q")
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        v = stop.value
    assert [type(e) for e in events] == [DraftProposed, DraftVerified, AnswerToken]
    # 'a','b' letters: s = 0.5 (rank 0 -> a=1); ' ' s ~ sqrt(1e-6 * 0.9) < 0.1 -> stop
    assert v.accepted == 2 and v.accepted_text == "ab" and events[1].accepted == 2 and events[1].drafted == 4
    assert events[2].text == "ab" and events[2].from_prophet
    assert agent.log == [("tokens", [ord("a"), ord("b")])]  # no adopt(): evaluated, exactly the prefix
    assert v.adopted == "evaluated"
    assert drafter.stats.acceptance_rate == 0.5


def test_adopt_is_used_when_the_runtime_has_it(drafter):
    agent = FakeSession(FakeModel())
    calls = []
    agent.adopt = lambda index, k: calls.append((index, k))
    v = drafter.verify(agent, drafter.draft(seprod.ANSWERING, "q", None))
    assert agent.kept and calls == [(0, 2)] and v.adopted == "adopted" and agent.log == []


def test_nothing_accepted_leaves_the_agent_untouched():
    d = seprod.Drafter(FakeModel(" !?"), agent_vocab=V, draft_len=3, tau=0.1, background=False)
    try:
        agent = FakeSession(FakeModel())
        v = d.verify(agent, d.draft(seprod.GROUNDING, "q", None))
        assert v.accepted == 0 and agent.log == [] and v.adopted == "none"
    finally:
        d.close()


def test_background_start_prepares_drafts_once():
    m = FakeModel("abc")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=3, background=True)
    try:
        d.start(image=b"I", question="q", target="cat")
        g = d.draft(seprod.GROUNDING, seprod.grounding_query("cat"), b"I")
        a = d.draft(seprod.ANSWERING, "q", b"I")
        assert g.text == a.text == "abc"
        gens = [e for s in m.sessions for e in s.log if e[0] == "generate"]
        assert len(gens) == 2  # the prepared drafts were used, not drafted again
    finally:
        d.close()


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="seprod_a0"):
        seprod.Drafter(FakeModel(), agent_vocab=V, a0=1.5)
    with pytest.raises(ConfigError, match="seprod_tau"):
        seprod.Drafter(FakeModel(), agent_vocab=V, tau=-1)


def test_a_new_image_drops_drafts_prepared_for_the_old_one():
    m = FakeModel("abc")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=3, background=True)
    try:
        d.start(image=b"OLD", question="q")
        d.start(image=b"NEW", question="q", target="cat")
        assert {k[2] for k in d._pending} == {seprod._image_key(b"NEW")}
        assert d.draft(seprod.ANSWERING, "q", b"NEW").text == "abc"
    finally:
        d.close()


def test_agent_writes_its_own_leading_whitespace_before_the_draft():
    """agent_lead: when the agent's greedy token is whitespace and the draft starts with content, that
    token goes first, scored and put in the cache in the same call as the draft."""
    d = seprod.Drafter(FakeModel("ab"), agent_vocab=V, draft_len=2, tau=0.1, background=False)
    try:
        dr = d.draft(seprod.ANSWERING, "q", None)
        agent = FakeSession(FakeModel())
        agent.prefer = [ord("\n")]
        v = d.verify(agent, dr)
        assert v.lead == (ord("\n"),) and v.accepted == 2 and v.scores.shape == (2,)
        assert agent.log == [("tokens", [10, 97, 98])]
        agent = FakeSession(FakeModel())
        agent.prefer = [ord("\n")]
        d.agent_lead = False
        assert d.verify(agent, dr).lead == ()
        d.agent_lead = True
        agent = FakeSession(FakeModel())  # greedy is content: nothing before the draft
        assert d.verify(agent, dr).lead == () and agent.log == [("tokens", [97, 98])]
    finally:
        d.close()


def test_a_failing_prophet_is_an_observation_not_a_crash(drafter):
    """a user-fixable prophet error (context full) -> AgentError(fatal=False), no draft, agent untouched."""
    from edge_agent.agent.events import AgentError
    from edge_agent.errors import ModelRuntimeError

    def boom(*a, **k):
        raise ModelRuntimeError("The context is full.", title="Context full")

    drafter.prophet.session = boom
    agent = FakeSession(FakeModel())
    gen = drafter.answer(agent, turn=1, image=b"I", question="q")
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        v = stop.value
    assert [type(e) for e in events] == [AgentError] and not events[0].fatal and "prophet" in events[0].message
    assert v.accepted == 0 and v.accepted_text == "" and agent.log == []
