"""SeProD acceptance maths and the drafter's logic, with fakes for the models (pure logic only).

The real-runtime tests (tiny agent + tiny prophet, SmolLM2 as both) are in test_seprod_runtime.py.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from edge_agent.agent import seprod, seprod_math, seprod_policy
from edge_agent.agent.events import AnswerToken, DraftProposed, DraftSkipped, DraftVerified
from edge_agent.core.errors import ConfigError
from edge_agent.runtime.types import Generation
from tests.fakes.sessions import PairSession as FakeSession
from tests.fakes.sessions import ProphetModel as FakeModel
from tests.fakes.sessions import SlowModel

V = 151_936


def test_normalised_rank_ends_and_log_scale():
    """argmax -> 1, last rank -> 0, and neighbouring top ranks stay distinguishable."""
    u = seprod_math.normalised_rank([0, 1, 10, 100, 1000, V - 1], V)
    assert u[0] == 1.0 and u[-1] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.diff(u) < 0)
    assert u[1] == pytest.approx(1 - math.log(2) / math.log(V))
    assert 0.55 < u[3] < 0.65  # rank 100 is far from the argmax, unlike a linear normalisation
    with pytest.raises(ValueError):
        seprod_math.normalised_rank([V], V)


def test_search_weight_grows_with_rank_between_a0_and_1():
    """higher rank (closer to the argmax) -> larger a_j; a_j in [a0, 1]."""
    ranks = np.array([V - 1, 5000, 50, 3, 0])
    for a0 in (0.0, 0.3, 0.5, 0.9):
        for gamma in (0.5, 1.0, 3.0):
            a = seprod_math.search_weight(ranks, V, a0, gamma)
            assert a[0] == pytest.approx(a0) and a[-1] == pytest.approx(1.0)
            assert np.all(np.diff(a) > 0) or a0 == 1.0
    a_sharp = seprod_math.search_weight([10], V, 0.5, 3.0)[0]
    a_soft = seprod_math.search_weight([10], V, 0.5, 0.5)[0]
    assert a_sharp < a_soft


def test_combined_score_is_the_weighted_geometric_mean():
    """s_j = p_s^a_j * p_p^(1-a_j), checked against a direct computation."""
    ps = np.array([0.9, 0.2, 0.05, 0.6])
    pp = np.array([0.5, 0.8, 0.9, 0.01])
    ranks = np.array([0, 3, 40, 1])
    s = seprod_math.combined_scores(np.log(ps), np.log(pp), ranks, V, 0.5)
    for j in range(4):
        a = 0.5 + 0.5 * (1 - math.log1p(ranks[j]) / math.log(V))
        assert s[j] == pytest.approx(ps[j] ** a * pp[j] ** (1 - a), rel=1e-12)
    assert s[0] == pytest.approx(0.9)  # the agent's argmax: only p_s counts
    # a0 = 1 ignores the prophet; a0 = 0 ignores the agent except as its rank lifts a_j
    assert np.allclose(seprod_math.combined_scores(np.log(ps), np.log(pp), ranks, V, 1.0), ps)


def test_combined_score_underflow_is_zero_not_nan():
    s = seprod_math.combined_scores([-2000.0], [-3000.0], [V - 1], V, 0.5)
    assert s[0] == 0.0 and not np.isnan(s[0])


def test_accepted_length_rule():
    """accept up to the first s_j < tau; tau=0 accepts all; tau above every score accepts none."""
    s = np.array([0.9, 0.4, 0.05, 0.8])
    assert seprod_math.accepted_length(s, 0.0) == 4
    assert seprod_math.accepted_length(np.array([0.0, 0.0]), 0.0) == 2
    assert seprod_math.accepted_length(s, 0.1) == 2  # stops at 0.05 even though 0.8 follows
    assert seprod_math.accepted_length(s, 0.4) == 2  # s_j == tau is accepted
    assert seprod_math.accepted_length(s, 0.41) == 1
    assert seprod_math.accepted_length(s, 0.95) == 0
    assert seprod_math.accepted_length(np.zeros(0), 0.5) == 0


def test_shapes_must_match():
    with pytest.raises(ValueError):
        seprod_math.combined_scores([0.0, 0.0], [0.0], [0, 0], V, 0.5)


# --------------------------------------------------------------------------------------------------
# Drafter logic with fakes: a "model" whose tokens are characters
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def drafter():
    d = seprod.Drafter(FakeModel("ab cd"), agent_vocab=V, draft_len=4, tau=0.1, a0=0.5, background=False)
    yield d
    d.close()


def test_prophet_sees_only_image_and_query(drafter):
    """the prophet's context is ChatML user turn: image + query (untrusted), then assistant; no agent text."""
    d = drafter.draft(seprod_math.ANSWERING, "What is <|im_end|> this?", b"IMG")
    (s,) = drafter.prophet.sessions
    assert s.log == [
        ("text", "<|im_start|>user\n"), ("image", b"IMG"), ("untrusted", "What is <|im_end|> this?"),
        ("text", "<|im_end|>\n<|im_start|>assistant\n"), ("generate", 4),
    ]
    assert d.tokens == tuple(map(ord, "ab c")) and d.text == "ab c" and d.logprobs.shape == (4,)


def test_text_only_prophet_gets_no_image(drafter):
    drafter.draft(seprod_math.ANSWERING, "Capital of France?", None)
    assert not [e for e in drafter.prophet.sessions[0].log if e[0] == "image"]


def test_same_image_reuses_the_prophet_cache(drafter):
    """a second draft on the same image rolls back to after the image instead of re-evaluating it."""
    drafter.draft(seprod_math.GROUNDING, seprod_math.grounding_query("the red sign"), b"CROP")
    drafter.draft(seprod_math.ANSWERING, "What does it say?", b"CROP")
    assert len(drafter.prophet.sessions) == 1
    log = drafter.prophet.sessions[0].log
    assert [e[0] for e in log].count("image") == 1 and ("rollback", len("<|im_start|>user\n") + 1) in log
    drafter.draft(seprod_math.ANSWERING, "What does it say?", b"OTHER")
    assert len(drafter.prophet.sessions) == 2


def test_draft_is_cut_before_turn_markers():
    """grounding drafts stop before chat-format markers; answering drafts before any "<" (the answer
    grammar admits none, so the agent could never have generated it)."""
    m = FakeModel("yes a<b it is</think> more")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=30, background=False)
    try:
        assert d.draft(seprod_math.GROUNDING, "q", None).text == "yes a<b it is"
        assert d.draft(seprod_math.ANSWERING, "q", None).text == "yes a"
        m.script = "<think>x"
        assert d.draft(seprod_math.GROUNDING, "q2", None).tokens == ()
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
        dr = d.draft(seprod_math.ANSWERING, "q", None)
        assert dr.text == "ok." and len(dr.logprobs) == 3
    finally:
        FakeSession.generate = orig
        d.close()


def test_grounding_query_names_the_target_and_asks_yes_or_no_first():
    q = seprod_math.grounding_query("  the  small sign ")
    assert "the small sign" in q and "yes or no first" in q
    assert "the object in question" in seprod_math.grounding_query("")


def test_round_events_and_acceptance(drafter):
    """DraftProposed then DraftVerified then (answering) AnswerToken(from_prophet); stop at the space."""
    agent = FakeSession(FakeModel())
    gen = drafter.answer(agent, turn=2, image=None, question="q")
    events, v = run_hook(gen)
    assert [type(e) for e in events] == [DraftProposed, DraftVerified, AnswerToken]
    # 'a','b' letters: s = 0.5 (rank 0 -> a=1); ' ' s ~ sqrt(1e-6 * 0.9) < 0.1 -> stop
    assert v.accepted == 2 and v.accepted_text == "ab" and events[1].accepted == 2 and events[1].drafted == 4
    assert events[2].text == "ab" and events[2].from_prophet
    assert agent.log == [("tokens", [ord("a"), ord("b")])]  # adopted: exactly the prefix
    assert v.adopted == "adopted"
    assert drafter.stats.acceptance_rate == 0.5


def test_adopt_is_used_when_the_runtime_has_it(drafter):
    agent = FakeSession(FakeModel())
    calls = []
    agent.adopt = lambda index, k: calls.append((index, k))
    v = drafter.verify(agent, drafter.draft(seprod_math.ANSWERING, "q", None))
    assert agent.kept and calls == [(0, 2)] and v.adopted == "adopted" and agent.log == []


def test_nothing_accepted_leaves_the_agent_untouched():
    d = seprod.Drafter(FakeModel(" !?"), agent_vocab=V, draft_len=3, tau=0.1, background=False)
    try:
        agent = FakeSession(FakeModel())
        v = d.verify(agent, d.draft(seprod_math.GROUNDING, "q", None))
        assert v.accepted == 0 and agent.log == [] and v.adopted == "none"
    finally:
        d.close()


def test_background_start_prepares_drafts_once():
    m = FakeModel("abc")
    d = seprod.Drafter(m, agent_vocab=V, draft_len=3, background=True)
    try:
        d.start(image=b"I", question="q", target="cat")
        g = d.draft(seprod_math.GROUNDING, seprod_math.grounding_query("cat"), b"I")
        a = d.draft(seprod_math.ANSWERING, "q", b"I")
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
        assert {k[2] for k in d.prepared()} == {seprod_math.draft_image_key(b"NEW")}
        assert d.draft(seprod_math.ANSWERING, "q", b"NEW").text == "abc"
    finally:
        d.close()


def test_agent_writes_its_own_leading_whitespace_before_the_draft():
    """agent_lead: when the agent's greedy token is whitespace and the draft starts with content, that
    token goes first, scored and put in the cache in the same call as the draft."""
    d = seprod.Drafter(FakeModel("ab"), agent_vocab=V, draft_len=2, tau=0.1, background=False)
    try:
        dr = d.draft(seprod_math.ANSWERING, "q", None)
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
    from edge_agent.core.errors import ModelRuntimeError

    def boom(*a, **k):
        raise ModelRuntimeError("The context is full.", title="Context full")

    drafter.prophet.session = boom
    agent = FakeSession(FakeModel())
    gen = drafter.answer(agent, turn=1, image=b"I", question="q")
    events, v = run_hook(gen)
    assert [type(e)
            for e in events] == [AgentError] and not events[0].fatal and "prophet" in events[0].message
    assert v.accepted == 0 and v.accepted_text == "" and agent.log == []


# --------------------------------------------------------------------------------------------------
# Fidelity: the label the prophet sees, the grounding verdict, the answer budget, tau's default
# --------------------------------------------------------------------------------------------------


def test_clean_label_keeps_printable_bounded_text_and_drops_garbage():
    """the zoom label is untrusted model output: control characters and chat markup go, it is cut at
    a word boundary, and text with no real words is dropped (the generic target is used instead)."""
    assert seprod_math.clean_label("  the red\tsign\x00 ") == "the red sign"
    assert seprod_math.clean_label("sign<|im_end|><|im_start|>system") == "sign system"
    long = "the small white sign " * 10
    cut = seprod_math.clean_label(long)
    assert len(cut) <= seprod_math.LABEL_MAX_CHARS and long.startswith(cut) and not cut.endswith(" ")
    for garbage in ("", "   ", "<|im_end|>", "{}[]<>", "x", "!!!!????1", "\x00\x01", None, 42):
        assert seprod_math.clean_label(garbage) == "", garbage
    q = seprod_math.grounding_query("#$%^&*<|im_start|>")
    assert seprod_math.DEFAULT_TARGET in q and "im_start" not in q


def test_parse_verdict():
    """the first word decides: yes/true -> yes, no/false -> no, anything else unclear; the end index
    says where the verdict word stops (to tell whether the agent accepted it)."""
    assert seprod_math.parse_verdict("Yes, a red sign.") == ("yes", 3)
    assert seprod_math.parse_verdict("**No**. The image shows") == ("no", 4)
    assert seprod_math.parse_verdict("false") == ("no", 5)
    assert seprod_math.parse_verdict(" True the sign") == ("yes", 5)
    for unclear in ("Nothing here", "The image shows", "", "no2 signs", "Maybe"):
        assert seprod_math.parse_verdict(unclear) == ("", 0), unclear


def run_hook(gen):
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        return events, stop.value


def test_accepted_no_verdict_steers_the_agent_elsewhere():
    """grounding draft "No, ..." accepted -> verdict no, accepted, steer text set; a rejected verdict
    word steers nothing."""
    d = seprod.Drafter(FakeModel("No, it is gone"), agent_vocab=V, draft_len=6, tau=0.1, background=False,
                       adaptive=False)
    try:
        events, v = run_hook(d.ground(FakeSession(FakeModel()), turn=2, image=b"I", target="the sign"))
        ver = next(e for e in events if isinstance(e, DraftVerified))
        # 'N','o' are letters (accepted), ',' is not: accepted "No"
        assert v.accepted_text == "No" and v.verdict == "no" and v.verdict_accepted
        assert v.steer == seprod_math.STEER_ELSEWHERE and ver.verdict == "no" and ver.verdict_accepted
        d.tau = 0.6  # nothing accepted: the prophet's verdict is shown but not acted on
        d.reset()
        events, v = run_hook(d.ground(FakeSession(FakeModel()), turn=2, image=b"I", target="the sign"))
        assert v.accepted == 0 and v.verdict == "no" and not v.verdict_accepted and v.steer == ""
        d.prophet.script = "Yes it is"
        d.tau = 0.1
        events, v = run_hook(d.ground(FakeSession(FakeModel()), turn=2, image=b"J", target="the sign"))
        assert v.verdict == "yes" and v.verdict_accepted and v.steer == ""
    finally:
        d.close()


def test_answer_budget_caps_lead_and_accepted_tokens():
    """max_tokens=3 with a lead token: 1 lead + at most 2 draft tokens enter the session."""
    d = seprod.Drafter(FakeModel("abcdefgh"), agent_vocab=V, draft_len=8, tau=0.0, background=False)
    try:
        agent = FakeSession(FakeModel())
        agent.prefer = [ord("\n")]
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q", max_tokens=3))
        assert v.lead == (10,) and v.accepted == 2 and agent.log == [("tokens", [10, 97, 98])]
        assert v.accepted_text == "ab" and next(e for e in events
                                                if isinstance(e, DraftVerified)).drafted == 2
        agent = FakeSession(FakeModel())
        agent.prefer = [ord("\n")]
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q2", max_tokens=1))
        assert v.lead == () and v.accepted == 1 and agent.log == [("tokens", [97])]
    finally:
        d.close()


def test_an_answering_draft_continues_the_answer_the_agent_began():
    """``written``: the answer's tokens the agent already wrote (SSR's answer check decodes the answer's start
    before it stays). The draft starts where the answer starts: when it begins with them, what is left of it
    is verified after them (the session holds them already); when it does not, none of it can follow
    ("diverged": the session untouched, the adaptive rule told nothing was accepted); when they hold the
    whole answer ("done"), nothing is drafted or waited for ("answered")."""
    d = seprod.Drafter(FakeModel("abcd"), agent_vocab=V, draft_len=4, tau=0.1, background=False)
    try:
        agent = FakeSession(FakeModel())
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q", written=(ord("a"),)))
        assert [type(e) for e in events] == [DraftProposed, DraftVerified, AnswerToken]
        assert events[0].tokens == (98, 99, 100) and "first 1 tokens, which the agent wrote" in events[0].note
        assert v.accepted == 3 and v.accepted_text == "bcd" and agent.log == [("tokens", [98, 99, 100])]
        assert d.stats.drafted_tokens == 3 and d.stats.accepted_tokens == 3
        agent = FakeSession(FakeModel())
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q2", written=(ord("a"), ord("x"))))
        assert [type(e) for e in events] == [DraftProposed, DraftSkipped] and events[1].reason == "diverged"
        assert events[0].tokens == (97, 98, 99, 100) and "'ax'" in events[1].detail
        assert v.accepted == 0 and v.skipped == "diverged" and agent.log == []
        assert d.stats.skipped == {"diverged": 1} and d.adaptive.acceptance("answering") < 1.0
        drafts = len(d.prophet.sessions) + sum(len(s.log) for s in d.prophet.sessions)
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q3", written=(97,), done=True))
        assert [(type(e), e.reason) for e in events] == [(DraftSkipped, "answered")] and agent.log == []
        assert len(d.prophet.sessions) + sum(len(s.log) for s in d.prophet.sessions) == drafts  # not drafted
        totals = d.stats.totals()
        assert totals["seprod_skipped_answered"] == 1 and totals["seprod_skipped_diverged"] == 1
    finally:
        d.close()


def test_drafter_default_tau_is_the_settings_default():
    import inspect

    from edge_agent.core.config import Settings

    default = inspect.signature(seprod.Drafter.__init__).parameters["tau"].default
    assert default == Settings().seprod_tau == seprod_math.DEFAULT_TAU


def test_prophet_threads_leave_the_agent_its_cores():
    # 2 cores: the agent decodes on 1, the prophet on the other
    assert seprod_policy.prophet_threads(1, 2) == 1
    assert seprod_policy.prophet_threads(3, 4) == 1
    assert seprod_policy.prophet_threads(4, 8) == 4
    assert seprod_policy.prophet_threads(8, 8) == 1  # never 0
    assert seprod_policy.prophet_threads(1, 1) == 1


def test_shared_threads_fit_the_cores_together():
    assert seprod_policy.shared_threads(1, 2) == (1, 1)  # 2 cores: unchanged
    assert seprod_policy.shared_threads(8, 8) == (7, 1)  # the agent's decoding gives up the prophet's core
    assert seprod_policy.shared_threads(4, 8) == (4, 4)
    assert seprod_policy.shared_threads(3, 4) == (3, 1)
    # one core: the prophet only drafts while the agent is idle
    assert seprod_policy.shared_threads(1, 1) == (1, 1)
    # a 2B agent decoding on both of 2 cores keeps them (2 threads: 79 ms/token, 1: 147): the prophet
    # computes only while it fits beside the agent (runtime.cores)
    assert seprod_policy.shared_threads(2, 2) == (2, 1)
    assert seprod_policy.shared_threads(4, 4) == (3, 1)
    for cores in range(2, 17):
        for agent in range(1, cores + 1):
            a, p = seprod_policy.shared_threads(agent, cores)
            assert a >= 1 and p >= 1
            assert a + p <= cores or (a == agent and cores - p < seprod_policy.KEEP_AT_LEAST)
            assert a >= min(agent, seprod_policy.KEEP_AT_LEAST)  # never below 3 threads (or what it had)


# --------------------------------------------------------------------------------------------------
# Adaptive drafting (per chat and mode)
# --------------------------------------------------------------------------------------------------


def test_adaptive_switches_a_mode_off_below_break_even_and_probes_again():
    a = seprod_policy.Adaptive(16)
    c = seprod_policy.Costs()
    assert a.plan(seprod_math.ANSWERING, c) == seprod_policy.Plan(True, 16)  # nothing known: the full draft
    a.record(seprod_math.ANSWERING, 16, 1)
    assert a.plan(seprod_math.ANSWERING, c).use  # one bad round is not enough
    a.record(seprod_math.ANSWERING, 16, 0)
    plans = []
    for _ in range(seprod_policy.PROBE_EVERY):
        p = a.plan(seprod_math.ANSWERING, c)
        plans.append(p.use)
        if not p.use:
            assert "below break-even" in p.note
            a.skipped(seprod_math.ANSWERING)
    assert plans == [False] * (seprod_policy.PROBE_EVERY - 1) + [True]  # the probe round drafts again
    assert a.plan(seprod_math.GROUNDING, c).use  # the other mode is not affected
    a.record(seprod_math.ANSWERING, 4, 4)  # the probe was accepted: the mode stays on
    a.record(seprod_math.ANSWERING, 16, 16)
    assert a.plan(seprod_math.ANSWERING, c).use
    fixed = seprod_policy.Adaptive(16, enabled=False)
    for _ in range(5):
        fixed.record(seprod_math.ANSWERING, 16, 0)
    assert fixed.plan(seprod_math.ANSWERING, c) == seprod_policy.Plan(True, 16)  # pinned for experiments


def test_adaptive_shortens_drafts_to_what_is_accepted():
    a = seprod_policy.Adaptive(16)
    c = seprod_policy.Costs(verify_token=0.001, agent_token=0.01)  # break-even 0.1
    a.record(seprod_math.ANSWERING, 16, 3)
    a.record(seprod_math.ANSWERING, 16, 3)
    p = a.plan(seprod_math.ANSWERING, c)
    assert p.use and p.draft_len == 8 and "L_d 8 of 16" in p.note  # ceil(2 * 3) + 2
    for _ in range(seprod_policy.WINDOW):
        a.record(seprod_math.ANSWERING, 8, 8)  # all accepted: back to the full length
    assert a.plan(seprod_math.ANSWERING, c) == seprod_policy.Plan(True, 16)


def test_costs_price_a_draft():
    c = seprod_policy.Costs()
    assert c.saving(0.5, 16) is None and c.break_even() == seprod_policy.PRIOR_VERIFY_RATIO
    c.prophet_token = 0.01  # stands in for the agent until the agent is measured
    assert c.saving(0.5, 10) == pytest.approx(0.5 * 10 * 0.01 - seprod_policy.PRIOR_VERIFY_RATIO * 10 * 0.01)
    c.agent_token, c.verify_token = 0.02, 0.004
    assert c.break_even() == pytest.approx(0.2)
    assert c.saving(0.5, 10) == pytest.approx(0.1 - 0.04)


def test_stats_count_used_skipped_and_waited_rounds():
    s = seprod_math.SeProDStats()
    d = seprod_math.Draft("answering", "q", (1, 2, 3, 4), np.zeros(4), "abcd", 0.1, waited=0.05)
    z = np.zeros(4)
    s.add(seprod_math.Verification(d, 2, z, z, z, z.astype(np.int64), "ab", 0.01))
    s.skip("not_ready", 0.02)
    s.skip("low_acceptance", 0.0)
    t = s.totals()
    assert t["seprod_rounds"] == 3 and t["seprod_drafts"] == 1 and t["seprod_drafts_skipped"] == 2
    assert t["seprod_drafts_waited"] == 1 and t["seprod_wait_seconds"] == pytest.approx(0.07)
    assert t["seprod_skipped_not_ready"] == 1 and t["seprod_skipped_low_acceptance"] == 1
    assert t["seprod_acceptance_answering"] == 0.5 and t["seprod_drafted_answering"] == 4


# --------------------------------------------------------------------------------------------------
# Drafts never block longer than they save (a prophet that takes real time per token)
# --------------------------------------------------------------------------------------------------


def slow_drafter(per_token, **costs):
    d = seprod.Drafter(SlowModel("abcdefgh", per_token), agent_vocab=V, draft_len=8, tau=0.1, background=True)
    for k, v in costs.items():
        setattr(d.costs, k, v)
    return d


def test_a_ready_draft_is_used_without_waiting():
    d = slow_drafter(0.001)
    try:
        d.draft(seprod_math.ANSWERING, "warm-up", b"I")  # a prophet's first draft is not measured (cold)
        d.start(image=b"I", question="q")
        d.wait_idle(timeout=5)  # the prepared draft is drafted (and stays prepared for its hook)
        assert (seprod_math.ANSWERING, "q", seprod_math.draft_image_key(b"I")) in d.prepared()
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=b"I", question="q"))
        prop = next(e for e in events if isinstance(e, DraftProposed))
        assert prop.waited < 0.05 and v.accepted == 8 and not v.skipped
        assert d.costs.prophet_token is not None  # measured from the draft's own tokens
    finally:
        d.close()


def test_a_draft_not_ready_is_skipped_when_waiting_costs_more_than_it_saves():
    """agent 1 ms/token, prophet 100 ms/token: 8 tokens would save < 4 ms, the draft needs ~0.8 s:
    the agent goes on at once, says why, its session is untouched, and the prophet stops drafting."""
    d = slow_drafter(0.1, agent_token=0.001, prophet_token=0.1, prefill_new_image=0.0)
    try:
        d.start(image=b"I", question="q")
        agent = FakeSession(FakeModel())
        t0 = time.perf_counter()
        events, v = run_hook(d.answer(agent, turn=1, image=b"I", question="q"))
        assert time.perf_counter() - t0 < 0.1
        assert [type(e) for e in events] == [DraftSkipped]
        assert events[0].reason == "not_ready" and "expected wait" in events[0].detail
        assert v.skipped == "not_ready" and v.accepted == 0 and agent.log == []
        d.wait_idle(timeout=5)  # the worker is free again well before 0.8 s
        assert time.perf_counter() - t0 < 0.5
        assert ("cancelled", 0) in d.prophet.sessions[0].log or any(
            e[0] == "cancelled" for e in d.prophet.sessions[0].log)
        assert d.stats.totals()["seprod_skipped_not_ready"] == 1
    finally:
        d.close()


def test_a_draft_is_waited_for_while_the_saving_exceeds_the_wait():
    """slow agent (1 s/token), prophet 20 ms/token: waiting ~0.16 s saves ~0.8 s: wait and use it."""
    d = slow_drafter(0.02, agent_token=1.0, prophet_token=0.02, prefill_new_image=0.0)
    try:
        d.start(image=b"I", question="q")
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=b"I", question="q"))
        prop = next(e for e in events if isinstance(e, DraftProposed))
        assert prop.waited > 0.01 and v.accepted == 8 and d.stats.waited == 1
    finally:
        d.close()


def test_a_draft_that_already_begins_otherwise_is_not_waited_for():
    """After the answer check (``written``), a draft still being drafted whose first tokens already differ
    from the answer's start is skipped at once ("diverged", the prophet stopped), even when experiments
    wait for every draft; one that agrees so far is waited for, and only its tokens after the check's can
    save anything (the expected saving is of those)."""
    d = seprod.Drafter(SlowModel("abcdefgh", 0.05), agent_vocab=V, draft_len=8, tau=0.1, background=True,
                       adaptive=False)
    try:
        assert d.block
        d.start(image=None, question="q")
        job = next(iter(d._pending.values()))
        deadline = time.perf_counter() + 5
        while not job.tokens and time.perf_counter() < deadline:
            time.sleep(0.005)
        agent = FakeSession(FakeModel())
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q", written=(ord("x"), ord("y"))))
        assert [(type(e), e.reason) for e in events] == [(DraftSkipped, "diverged")], events
        assert v.skipped == "diverged" and agent.log == [] and job.cancel.is_set()
        d.wait_idle(timeout=5)
        assert any(e[0] == "cancelled" for e in d.prophet.sessions[0].log)  # stopped before its 8 tokens
        d.start(image=None, question="q2")
        events, v = run_hook(d.answer(agent, turn=1, image=None, question="q2", written=(ord("a"),)))
        assert [type(e) for e in events] == [DraftProposed, DraftVerified, AnswerToken]
        assert events[0].tokens == tuple(map(ord, "bcdefgh")) and v.accepted == 7
    finally:
        d.close()
    # agent 200 ms/token, prophet 50: the whole draft (8 tokens) would save more than the ~0.4 s it needs,
    # the 2 tokens after 6 written less: not waited for
    d = slow_drafter(0.05, agent_token=0.2, prophet_token=0.05, verify_token=0.001, prefill_new_image=0.0,
                     prefill_same_image=0.0)
    try:
        acc = d.adaptive.acceptance(seprod_math.ANSWERING)
        assert d.costs.saving(acc, 2) < 0.4 < d.costs.saving(acc, 8)
        d.start(image=None, question="q")
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question="q",
                                      written=tuple(map(ord, "abcdef"))))
        assert [(type(e), e.reason) for e in events] == [(DraftSkipped, "not_ready")]
        assert "expected saving" in events[0].detail
    finally:
        d.close()


def test_nothing_measured_means_no_waiting():
    """a cold start (no cost measured at all) never blocks the agent on a draft that is not ready."""
    d = slow_drafter(0.05)
    try:
        d.start(image=b"I", question="q")
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=b"I", question="q"))
        assert isinstance(events[0], DraftSkipped) and "cannot be priced" in events[0].detail
    finally:
        d.close()


def test_pinned_settings_wait_for_every_draft():
    """seprod_adaptive false (experiments): the same cold start waits for the draft and uses it, so
    what an experiment measures does not depend on timing."""
    d = seprod.Drafter(SlowModel("abcdefgh", 0.05), agent_vocab=V, draft_len=8, tau=0.1, background=True,
                       adaptive=False)
    try:
        assert d.block
        d.start(image=b"I", question="q")
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=b"I", question="q"))
        prop = next(e for e in events if isinstance(e, DraftProposed))
        assert prop.waited > 0.1 and v.accepted == 8 and not any(isinstance(e, DraftSkipped) for e in events)
    finally:
        d.close()


def test_low_acceptance_mode_is_not_drafted_and_says_so():
    d = seprod.Drafter(FakeModel(" !?"), agent_vocab=V, draft_len=3, tau=0.1, background=False)
    try:
        for q in ("q1", "q2"):  # nothing accepted twice: the answering mode switches off
            d.start(image=None, question=q)
            run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question=q))
        gens_before = sum(e[0] == "generate" for s in d.prophet.sessions for e in s.log)
        d.start(image=None, question="q3")
        events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question="q3"))
        assert [type(e) for e in events] == [DraftSkipped] and events[0].reason == "low_acceptance"
        # not drafted
        assert sum(e[0] == "generate" for s in d.prophet.sessions for e in s.log) == gens_before
        d.reset(new_chat=True)  # a new chat starts from the prior again
        assert d.adaptive.plan(seprod_math.ANSWERING, d.costs).use
    finally:
        d.close()


def test_the_app_shows_verdicts_waits_and_skipped_drafts():
    """the turn view's draft lines: the grounding verdict (and whether it was accepted), the wait and
    the L_d note of a proposed draft, and a skipped draft with its reason."""
    from edge_agent.ui.widgets.reasoning import draft_text, skipped_text

    prop = DraftProposed(turn=2, mode="grounding", text="No, it is gone", tokens=(1, 2, 3), seconds=0.1,
                         waited=0.02, note="L_d 8 of 16 (recent acceptance 0.30)")
    ver = DraftVerified(turn=2, mode="grounding", accepted=1, drafted=3, accepted_text="No",
                        scores=(1.0, 0.0, 0.0),
                        seconds=0.01, verdict="no", verdict_accepted=True)
    line = draft_text(ver, prop).plain
    assert ("verdict NO" in line and "look elsewhere" in line and "waited 20 ms" in line
            and "L_d 8 of 16" in line)
    assert "1/3 tokens accepted" in line
    unclear = DraftVerified(turn=2, mode="grounding", accepted=0, drafted=3, accepted_text="",
                            scores=(0.0,) * 3,
                            seconds=0.01)
    assert "verdict unclear" in draft_text(unclear, None).plain
    skip = DraftSkipped(turn=1, mode="answering", reason="not_ready",
                        detail="expected wait 300 ms > expected saving 20 ms",
                        waited=0.0)
    line = skipped_text(skip).plain
    assert ("draft skipped: not ready in time" in line and "expected wait 300 ms" in line
            and "waited" not in line)
    skip = DraftSkipped(turn=1, mode="grounding", reason="low_acceptance", detail="grounding drafts off")
    assert "recent drafts were not accepted" in skipped_text(skip).plain


@pytest.mark.asyncio
async def test_the_app_shows_the_verdict_and_skipped_drafts_of_a_stored_chat(edge_home, tmp_path):
    """end to end in the app: SeProD events stored with a chat (as the engine streams them) come back
    as the turn view's lines: drafts used with the verdict, drafts skipped with their reason."""
    from textual.widgets import Static

    from edge_agent.agent import events as ev
    from edge_agent.chat.store import ChatStore
    from edge_agent.core.config import Settings
    from edge_agent.ui.app import EdgeAgentApp
    from edge_agent.ui.widgets.reasoning import TurnView
    from tests.fakes.engines import ScriptedEngine
    from tests.files import make_image
    from tests.pilot import settle

    settings = Settings.load()
    image = make_image(tmp_path / "photo.png", (96, 64))
    store = ChatStore(settings.chats_path)
    cid = store.new_chat()
    store.add_user_message(cid, "What does the sign say?", str(image))
    mid = store.start_answer(cid)
    for e in (ev.TurnStarted(turn=1), ev.DraftSkipped(turn=1, mode="answering", reason="not_ready",
                                                       detail="expected wait 300 ms > expected saving 20 ms"),
              ev.TurnStarted(turn=2),
              ev.DraftProposed(turn=2, mode="grounding", text="No, it is not here", tokens=(1, 2, 3),
                               seconds=0.2),
              ev.DraftVerified(turn=2, mode="grounding", accepted=2, drafted=3, accepted_text="No,",
                               scores=(0.9, 0.8, 0.01), seconds=0.05, verdict="no", verdict_accepted=True),
              ev.DraftSkipped(turn=2, mode="answering", reason="low_acceptance",
                              detail="answering drafts off"),
              ev.AnswerToken(turn=2, text="Stop"),
              ev.FinalAnswer(answer="Stop", turns=2, stop_reason="answered")):
        store.add_event(mid, e)
    store.finish_answer(mid, "answered")
    store.close()
    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s), open_chat=cid)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        turns = view.turns
        assert isinstance(turns[1], TurnView) and isinstance(turns[2], TurnView)

        def lines(t):
            return " | ".join(str(w.render()) for w in t.query(Static).filter(".draft"))

        assert "draft skipped: not ready in time" in lines(turns[1])
        text2 = lines(turns[2])
        assert "verdict NO" in text2 and "look elsewhere" in text2 and "2/3 tokens accepted" in text2
        assert "recent drafts were not accepted" in text2


def test_prepared_drafts_are_fitted_to_the_time_before_their_hook():
    """measured: the agent needs the answering draft ~100 ms after it is prepared, the prophet takes
    20 ms + 10 ms a token: the draft is cut to what is ready by then (plus the wait its saving pays
    for); with ~10 ms of lead nothing fits: no prophet work at all, skipped as not ready (and drafted
    again every PROBE_EVERY-th time, since costs change)."""
    d = seprod.Drafter(FakeModel("abcdefghijklmnop"), agent_vocab=V, draft_len=16, tau=0.1, background=True)
    try:
        d.costs.prophet_token, d.costs.prefill_same_image, d.costs.prefill_new_image = 0.01, 0.02, 0.02
        d.costs.lead[seprod_math.ANSWERING] = 0.1
        d.start(image=None, question="q")
        plan = d.prepared()[(seprod_math.ANSWERING, "q", "")]
        # saving(0.5, 16) = 0.5*16*0.01 - 0.4*16*0.01 = 0.016 s of wait: (0.1 + 0.016 - 0.02) / 0.01 = 9
        assert plan.use and plan.draft_len == 9 and "L_d 9 of 16" in plan.note
        d.reset()
        gens = []
        for i in range(seprod_policy.PROBE_EVERY):
            d.costs.lead[seprod_math.ANSWERING] = 0.01
            d.start(image=None, question=f"q{i}")
            plan = d.prepared()[(seprod_math.ANSWERING, f"q{i}", "")]
            gens.append(plan.use)
            events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question=f"q{i}"))
            if not plan.use:
                assert [type(e) for e in events] == [DraftSkipped] and events[0].reason == "not_ready"
                assert "not drafted: it needs" in events[0].detail and v.skipped == "not_ready"
        assert gens == [False] * (seprod_policy.PROBE_EVERY - 1) + [True]
        drafted = sum(e[0] == "generate" for s in d.prophet.sessions for e in s.log)
        assert drafted <= 2  # the first prepared draft (L_d 9) and the probe: skipped ones cost nothing
    finally:
        d.close()


def test_drafts_that_are_always_cancelled_still_teach_the_drafter_to_stop():
    """the agent always reaches the hook at once and the prophet is slow: the first prepared drafts are
    cancelled, but even cancelled they are measured, so later ones are not drafted at all (no prophet
    CPU spent on drafts nobody will use)."""
    d = slow_drafter(0.05, agent_token=0.001)
    try:
        d.draft(seprod_math.ANSWERING, "warm-up", None)  # the first draft is not measured
        details = []
        for i in range(3):
            d.start(image=None, question=f"q{i}")
            events, v = run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question=f"q{i}"))
            assert [type(e) for e in events] == [DraftSkipped] and v.skipped == "not_ready"
            details.append(events[0].detail)
            d.wait_idle(timeout=5)  # the cancelled draft has ended
        # drafted, cancelled
        assert details[0].startswith(("expected wait", "waited its expected saving", "it would save nothing"))
        assert "not drafted: it needs" in details[-1]  # not drafted at all
        assert d.costs.prefill_same_image is not None and d.costs.lead[seprod_math.ANSWERING] < 0.05
    finally:
        d.close()


def test_probes_of_drafts_that_never_fit_back_off():
    """a draft that never fits in time is probed (short) after PROBE_EVERY skips, then after twice as
    many, and so on: little prophet work is spent on checking whether the machine got faster."""
    d = seprod.Drafter(FakeModel("abc"), agent_vocab=V, draft_len=16, background=True)
    try:
        d.costs.prophet_token, d.costs.prefill_same_image, d.costs.lead[
            seprod_math.ANSWERING] = (0.05, 0.05, 0.01)
        mode = seprod_math.ANSWERING
        plans = [d.fitter.fit(mode, seprod_policy.Plan(True, 16), d.costs, d.adaptive.acceptance(mode),
                              ahead=0.0,
                              new_image=False)[0] for _ in range(24)]
        probes = [i for i, p in enumerate(plans) if p.use]
        g = seprod_policy.PROBE_EVERY
        assert probes == [g - 1, g - 1 + 2 * g, g - 1 + 2 * g + 4 * g][: len(probes)] and len(probes) >= 2
        assert all(plans[i].draft_len == seprod_policy.MIN_DRAFT_LEN and "probing" in plans[i].note
                   for i in probes)
        assert all(p.reason == "not_ready" for p in plans if not p.use)
    finally:
        d.close()



def test_a_probe_that_is_ready_but_accepts_nothing_still_backs_off():
    """a probe draft ready in time whose tokens are all rejected is no reason to probe more often; one
    with accepted tokens is (the gap goes back to PROBE_EVERY)."""
    g = seprod_policy.PROBE_EVERY
    for text, tau, gap in (("abc", 0.99, 2 * g), ("abc", 0.0, None)):
        d = seprod.Drafter(FakeModel(text), agent_vocab=V, draft_len=16, tau=tau, background=True)
        try:
            d.costs.prophet_token, d.costs.prefill_same_image, d.costs.lead[
                seprod_math.ANSWERING] = (0.05, 0.05, 0.01)
            for _ in range(g):  # g - 1 skips, then the probe, prepared as Drafter.start does
                d.start(image=None, question="q")
                run_hook(d.answer(FakeSession(FakeModel()), turn=1, image=None, question="q"))
            assert d.stats.drafts == 1  # the probe was used
            assert d.fitter.gaps.get(seprod_math.ANSWERING) == gap
        finally:
            d.close()
