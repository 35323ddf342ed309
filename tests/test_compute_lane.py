"""One OpenMP team per model (runtime.cores.ComputeLane), whichever thread asks for a pass.

libgomp keeps a team of worker threads per thread that starts a parallel region; two teams alive on
a machine with fewer cores than their threads make every multi-threaded llama.cpp pass ~30% slower
for good (the read-ahead thread and the question's thread did that: docs/measurements.md).
Real llama.cpp on the tiny Qwen3-VL model with 2 threads; the lane itself is pure logic.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_agent.runtime.cores import ComputeLane


def test_lane_runs_calls_on_its_one_thread_and_returns_or_raises() -> None:
    lane = ComputeLane("t")
    seen: list[int] = []
    assert lane.run(lambda a, b: (seen.append(threading.get_ident()), a + b)[1], 2, 3) == 5

    def other() -> None:
        lane.run(lambda: seen.append(threading.get_ident()))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(set(seen)) == 1 and seen[0] != threading.get_ident() and lane.calls == 2
    with pytest.raises(ValueError, match="boom"):
        lane.run(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert lane.run(lambda: lane.run(lambda: 7)) == 7  # a call from the lane's own thread runs in place
    lane.close()
    assert lane.run(threading.get_ident) == threading.get_ident()  # closed: runs on the caller
    lane.close()  # idempotent


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _uses_libgomp() -> bool:
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def test_passes_from_many_threads_share_one_openmp_team(tiny_models) -> None:
    """three threads that stay alive each decode with 2 threads: one team (the lane's) serves them all,
    and the logits equal a decode on the caller's own thread of a model without a lane."""
    from edge_agent.runtime import Model

    with Model.load(tiny_models["text"], None, n_ctx=512, n_threads=2, n_threads_batch=2, kv_type="f32") as m:
        toks = m.tokenize("The quick brown fox jumps over the lazy dog.", special=False)
        s = m.session()
        s.append_tokens(toks)
        ref = np.array(s.next_logits())
        calls0 = m.handle.lane.calls
        before = _threads()
        release, done = threading.Event(), []

        def worker() -> None:
            s = m.session()
            s.append_tokens(toks)
            done.append(np.array(s.next_logits()))
            release.wait()  # stay alive: a thread's OpenMP team lives as long as the thread

        workers = [threading.Thread(target=worker) for _ in range(3)]
        for t in workers:
            t.start()
            while len(done) < workers.index(t) + 1:
                t.join(0.01)
        during = _threads()
        release.set()
        for t in workers:
            t.join()
        if _uses_libgomp():  # the three callers and no team of their own (one worker each without the lane)
            assert during - before == 3
        assert m.handle.lane.calls >= calls0 + 3
        for got in done:
            np.testing.assert_array_equal(got, ref)
