"""Two models computing in one process share the cores (runtime.cores): the rule in isolation, then on
the real runtime (a preempted prophet decode runs again and gives exactly what an undisturbed one gives).

The rule: never more compute threads than cores; the foreground (the agent) never waits for the
background (the prophet) except for a preempted step to stop; a background step waits while it would
not fit beside the foreground.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

from edge_agent.runtime.cores import BACKGROUND, FOREGROUND, CoreShare
from tests.waits import wait_until


def in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # reported by the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# --------------------------------------------------------------------------------------------------
# the rule (pure logic, real threads)
# --------------------------------------------------------------------------------------------------


def test_alone_each_gets_what_it_asks_and_a_decode_fits_beside_a_step():
    share = CoreShare(2)
    with share.foreground(2) as n:
        assert n == 2 and share.busy == (2, 0)
    with share.background(1) as step:
        assert not step.preempted and share.busy == (0, 1)
        with share.foreground(1) as n:  # the agent's token-by-token decode (1 thread) beside it: no conflict
            assert n == 1 and share.busy == (1, 1)
    assert share.busy == (0, 0) and share.preemptions == 0 and share.background_waits == 0


def test_a_background_step_waits_for_the_foreground_pass_to_end():
    share = CoreShare(2)
    started = threading.Event()

    def step():
        with share.background(1):
            started.set()

    with share.foreground(2):
        t, out = in_thread(step)
        wait_until(lambda: share.background_waits == 1, timeout=5, what="the step to start waiting")
        assert not started.is_set()  # both cores are the agent's: the prophet waits
    t.join(5)
    assert started.is_set() and "error" not in out
    assert share.background_waits == 1 and share.background_wait_seconds > 0


def test_the_foreground_preempts_a_step_and_gets_every_core():
    share = CoreShare(2)
    stopped = threading.Event()
    inside, release = threading.Event(), threading.Event()

    def step():
        with share.background(1, preempt=stopped.set) as s:
            inside.set()
            stopped.wait(5)  # "computing" until its abort flag is set
            return s.preempted

    t, out = in_thread(step)
    assert inside.wait(5)
    t0 = time.perf_counter()
    with share.foreground(2) as n:
        waited = time.perf_counter() - t0
        assert n == 2 and share.busy == (2, 0)
        release.set()
    t.join(5)
    assert out["value"] is True and share.preemptions == 1 and share.foreground_reduced == 0
    assert waited < 1.0  # only until the step let go


def test_a_step_that_cannot_be_stopped_leaves_the_foreground_fewer_threads_not_a_wait():
    share = CoreShare(2)
    inside, done = threading.Event(), threading.Event()

    def encode():  # an image encode: no abort hook
        with share.background(1):
            inside.set()
            done.wait(5)

    t, _ = in_thread(encode)
    assert inside.wait(5)
    t0 = time.perf_counter()
    with share.foreground(2) as n:
        assert n == 1 and time.perf_counter() - t0 < 0.5
    done.set()
    t.join(5)
    assert share.foreground_reduced == 1 and share.preemptions == 0


def test_a_preempted_step_does_not_start_again_while_the_foreground_waits_for_it():
    """the foreground claims its cores before waiting: the step's retry waits for the pass to end."""
    share = CoreShare(2)
    flag = threading.Event()
    log: list[str] = []
    inside = threading.Event()

    def prophet():
        while True:
            with share.background(1, preempt=flag.set) as s:
                log.append("step")
                inside.set()
                flag.wait(0.3)
                if not s.preempted:
                    return
            flag.clear()
            log.append("preempted")

    t, out = in_thread(prophet)
    assert inside.wait(5)
    with share.foreground(2) as n:
        assert n == 2
        # the retry has come back for the cores and waits for the pass: it is not running meanwhile
        wait_until(lambda: share.background_waits == 1, timeout=5, what="the preempted step's retry to wait")
        assert share.busy == (2, 0) and log == ["step", "preempted"]
    t.join(5)
    assert log == ["step", "preempted", "step"] and share.foreground_reduced == 0


def test_stop_ends_a_background_wait():
    share = CoreShare(2)
    cancel = threading.Event()
    with share.foreground(2):
        t, out = in_thread(lambda: share.background(1, stop=cancel.is_set).__enter__())
        wait_until(lambda: share.background_waits == 1, timeout=5, what="the step to start waiting")
        assert t.is_alive()
        cancel.set()
        t.join(5)
        assert not t.is_alive() and "error" not in out


def test_bad_cores():
    with pytest.raises(ValueError):
        CoreShare(0)


# --------------------------------------------------------------------------------------------------
# the real runtime: SmolLM2 as agent and prophet on one CoreShare of 2 cores
# --------------------------------------------------------------------------------------------------

LONG = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(40))


@pytest.fixture(scope="module")
def smol_two(smollm2_gguf):
    from edge_agent.runtime import Model

    agent = Model.load(smollm2_gguf, n_ctx=2048, n_threads=1, n_threads_batch=2)
    prophet = Model.load(smollm2_gguf, n_ctx=2048, n_threads=1, n_threads_batch=1)
    yield agent, prophet
    prophet.close()
    agent.close()


def prophet_prefill(prophet):
    s = prophet.session()
    s.append_text(LONG)
    return s.next_logits().copy(), s.n_cells, s.n_pos


def test_a_preempted_prophet_decode_runs_again_and_gives_the_undisturbed_result(smol_two):
    """the prophet prefills ~600 tokens in one decode (1 thread, hundreds of ms); the agent starts a
    batched pass meanwhile: the prophet's decode is stopped, its cells removed by llama.cpp, and run
    again after the agent's pass. Its logits, cells and positions equal a run nobody disturbed."""
    agent, prophet = smol_two
    ref_logits, ref_cells, ref_pos = prophet_prefill(prophet)
    share = CoreShare(2)
    agent.share_cores(share, FOREGROUND)
    prophet.share_cores(share, BACKGROUND)
    try:
        t, out = in_thread(lambda: prophet_prefill(prophet))
        wait_until(lambda: share.busy[1] == 1, timeout=10)  # the prophet's decode is running
        s = agent.session()
        s.append_text("The agent reads its own prompt now. " * 8)  # a batched pass: wants both cores
        shared_logits = s.next_logits().copy()
        t.join(60)
        assert "error" not in out, out.get("error")
        logits, cells, pos = out["value"]
        assert share.preemptions >= 1 and share.foreground_reduced == 0
        assert (cells, pos) == (ref_cells, ref_pos)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-4)
        assert int(np.argmax(logits)) == int(np.argmax(ref_logits))
        # the agent's pass gives what it gives with no prophet at all
        agent.share_cores(None)
        alone = agent.session()
        alone.append_text("The agent reads its own prompt now. " * 8)
        np.testing.assert_allclose(alone.next_logits(), shared_logits, atol=1e-4)
    finally:
        agent.share_cores(None)
        prophet.share_cores(None)


def test_a_cancelled_prophet_stops_while_waiting_for_the_cores(smol_two):
    """while the agent holds both cores, a cancelled draft does not wait for them: "cancelled" at once."""
    agent, prophet = smol_two
    share = CoreShare(2)
    prophet.share_cores(share, BACKGROUND)
    cancel = threading.Event()
    try:
        s = prophet.session()
        s.append_text("Hello")
        with share.foreground(2):
            t, out = in_thread(lambda: s.generate(max_tokens=20, cancel=cancel))
            wait_until(lambda: share.background_waits == 1, timeout=10,
                       what="the draft's decode to wait for the cores")
            assert t.is_alive()  # waiting for the cores
            cancel.set()
            t.join(5)
            assert not t.is_alive() and out["value"].stop_reason == "cancelled"
    finally:
        prophet.share_cores(None)


def test_a_foreground_pass_uses_the_threads_it_is_given(smol_two):
    """beside a step that cannot be stopped the agent's batched pass runs on the cores left (the
    context's thread count is set for the pass), and alone again on all it asks for."""
    agent, prophet = smol_two
    share = CoreShare(2)
    agent.share_cores(share, FOREGROUND)
    try:
        with share.background(1):  # e.g. the prophet encoding an image
            agent.session().append_text("one two three four five")
            assert agent.handle.threads_now == (1, 1)
        agent.session().append_text("one two three four five")
        assert agent.handle.threads_now == (1, 2)
    finally:
        agent.share_cores(None)
    assert agent.handle.threads_now == (agent.n_threads, agent.n_threads_batch)


class PreemptAtStart(CoreShare):
    """A share that preempts every stoppable background step the moment it starts, once (its run
    again goes through): the worst timing, made deterministic (the decode aborts at its first node)."""

    def __init__(self) -> None:
        super().__init__(2)
        self.again = False  # the next step is the run again of a preempted one

    @contextlib.contextmanager
    def background(self, want, *, stop=None, preempt=None):
        with super().background(want, stop=stop, preempt=preempt) as step:
            if preempt is not None and not self.again:
                step.preempted = True
                self.preemptions += 1
                preempt()
            self.again = step.preempted
            yield step


@pytest.fixture(scope="module")
def tiny_prophet(tiny_models):
    from edge_agent.runtime import Model

    m = Model.load(tiny_models["prophet"], tiny_models["mmproj"], kv_type="f32", n_ctx=2048, n_threads=1,
                   n_threads_batch=1)
    yield m
    m.close()


def prophet_with_image(m, png: bytes):
    s = m.session()
    s.append_text("<|im_start|>user\n")
    s.append_image(png)
    s.append_text("Is there a sign?<|im_end|>\n<|im_start|>assistant\n")
    g = s.generate(max_tokens=6)
    return s.next_logits().copy(), g.tokens, g.logprobs, s.n_cells, s.n_pos


def test_every_preempted_step_of_a_draft_runs_again_exactly(tiny_prophet):
    """text prefill, the image's decode (from its embedding) and each drafted token, every one
    aborted once at its start: the draft (tokens, log-probs), the final logits, cells and positions
    are those of an undisturbed run (F32 weights and KV: to 1e-6)."""
    import io

    from PIL import Image

    from edge_agent.runtime import vision

    buf = io.BytesIO()
    Image.new("RGB", (64, 96), (10, 200, 90)).save(buf, "PNG")
    png = buf.getvalue()
    vision.clear_cache()
    ref = prophet_with_image(tiny_prophet, png)
    share = PreemptAtStart()
    tiny_prophet.share_cores(share, BACKGROUND)
    try:
        got = prophet_with_image(tiny_prophet, png)
    finally:
        tiny_prophet.share_cores(None)
    assert share.preemptions >= 1 + 1 + 1 + 5  # text, image, text, the drafted tokens
    assert got[1] == ref[1] and got[3:] == ref[3:]
    np.testing.assert_allclose(got[2], ref[2], atol=1e-6)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-6)


def test_an_interrupt_during_a_preempted_step_is_not_taken_for_the_preemption(tiny_prophet):
    """Model.interrupt() and a preemption of the same decode: the call is cancelled, not run again."""
    from edge_agent.core.errors import Cancelled

    class PreemptAndInterrupt(CoreShare):
        done = False

        @contextlib.contextmanager
        def background(self, want, *, stop=None, preempt=None):
            with super().background(want, stop=stop, preempt=preempt) as step:
                if not self.done:  # once: a retry (the bug) would then succeed and the test fail
                    self.done = True
                    step.preempted = True
                    preempt()
                    tiny_prophet.interrupt()
                yield step

    s = tiny_prophet.session()
    s.append_text("<|im_start|>user\n")
    cells = s.n_cells
    tiny_prophet.share_cores(PreemptAndInterrupt(2), BACKGROUND)
    try:
        with pytest.raises(Cancelled):
            s.append_text("Is there a sign?")
    finally:
        tiny_prophet.share_cores(None)
    assert s.n_cells == cells
    s.append_text("Is there a sign?")  # and the session goes on
    assert s.n_cells > cells
