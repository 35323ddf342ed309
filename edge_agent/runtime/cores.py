"""Sharing the CPU cores between two models computing in one process (the agent and SeProD's prophet).

What it knows: how many compute threads are running now, per role, and the one rule that keeps two
models from slowing each other down: **never more compute threads than cores, and the foreground
model never waits.** llama.cpp's CPU threads synchronise after every graph node by spinning
(OpenMP); one thread more than there are cores makes a multi-token decode stall at every node
(measured on 2 cores, SmolLM2-135M: the agent's prefill 3.3x and its rationale scoring 2.7x slower
while the prophet drafted with one thread beside the agent's two).

- The **foreground** model (the agent, which the person waits for) computes whenever it wants, with
  the threads it asks for. When background steps hold cores it needs, it **preempts** them: their
  abort flag is set, llama.cpp stops the step within one graph node and removes the cells of the
  aborted ubatch, and the step runs again once the foreground's pass is over (the result is the one
  an undisturbed step gives). Only a step that cannot be stopped (an image encode) leaves the
  foreground fewer threads for a pass (applied with ``llama_set_n_threads``); it never waits for one.
- A **background** step (one prophet decode, or its image encode) starts only when its threads fit
  beside what the foreground computes now; otherwise it waits until the foreground's pass ends.
  On 2 cores the prophet therefore drafts while the agent decodes token by token (one thread) or
  does not compute at all (tools, the network, the person typing), and pauses during the agent's
  batched passes (prefill, rationale scoring, verification), which get both cores.

What it does not know: llama.cpp, models, sessions (``runtime.model.Model.computing`` asks it before
every decode and encode), what is being computed or why.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import TypeVar

T = TypeVar("T")

FOREGROUND = "foreground"
BACKGROUND = "background"


PREEMPT_WAIT = 0.05  # most seconds a foreground pass waits for preempted background steps to stop


class Step:
    """A background step running now. ``preempted``: the foreground took its cores (its abort was
    requested through ``preempt``): the caller runs the step again once the foreground lets it."""

    def __init__(self, want: int, preempt: Callable[[], None] | None) -> None:
        self.want, self.preempt, self.preempted = want, preempt, False


class CoreShare:
    """The cores of one machine, shared by a foreground model and background models (see module doc).

    ``cores``: how many compute threads may run at once (physical cores).
    Counters for tests and benchmarks: ``background_waits`` / ``background_wait_seconds`` (steps that
    waited for a foreground pass, and for how long), ``preemptions`` (background steps stopped
    mid-way for a foreground pass), ``foreground_reduced`` (passes that ran with fewer threads than
    asked: a background step that cannot be stopped, e.g. an image encode, was running).
    """

    def __init__(self, cores: int) -> None:
        if cores < 1:
            raise ValueError("cores must be at least 1")
        self.cores = cores
        self._cv = threading.Condition()
        self._fg = 0  # threads the foreground computes with now (0: not computing)
        self._bg = 0  # threads of the background steps running now
        self._steps: list[Step] = []
        self.background_waits = 0
        self.background_wait_seconds = 0.0
        self.preemptions = 0
        self.preempt_wait_seconds = 0.0  # foreground time spent waiting for preempted steps to stop
        self.foreground_reduced = 0

    @property
    def busy(self) -> tuple[int, int]:
        """(foreground threads, background threads) computing now."""
        with self._cv:
            return self._fg, self._bg

    @contextlib.contextmanager
    def foreground(self, want: int) -> Iterator[int]:
        """A foreground pass that wants ``want`` threads: yields the threads to use.

        When background steps hold cores it needs, those that can be stopped are preempted (their abort
        is requested; they stop within one graph node and run again later) and the pass starts once
        they have let go (at most ``PREEMPT_WAIT``). It runs with fewer threads only beside a step
        that cannot be stopped (at least 1)."""
        want = max(1, min(want, self.cores))
        with self._cv:
            self._fg += want  # claimed at once: a preempted step must not start again meanwhile
            if self._bg + want > self.cores:
                for step in self._steps:
                    if step.preempt is not None and not step.preempted:
                        step.preempted = True
                        self.preemptions += 1
                        step.preempt()
                t0 = time.perf_counter()
                deadline = t0 + PREEMPT_WAIT
                while self._bg + want > self.cores and any(s.preempted for s in self._steps):
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                self.preempt_wait_seconds += time.perf_counter() - t0
            n = max(1, min(want, self.cores - self._bg))
            if n < want:
                self.foreground_reduced += 1
            self._fg += n - want
        try:
            yield n
        finally:
            with self._cv:
                self._fg -= n
                self._cv.notify_all()

    @contextlib.contextmanager
    def background(self, want: int, *, stop: Callable[[], bool] | None = None,
                   preempt: Callable[[], None] | None = None) -> Iterator[Step]:
        """A background step of ``want`` threads: waits while it would not fit beside the foreground.

        ``preempt``: how the foreground stops this step mid-way (sets the model's abort flag); None:
        it cannot be stopped. ``stop()`` true ends the wait early (a cancelled draft goes on to its
        decode, which its abort flag then stops at once). Yields the :class:`Step`."""
        want = max(1, min(want, self.cores))
        with self._cv:
            if self._fg + self._bg + want > self.cores:
                t0 = time.perf_counter()
                self.background_waits += 1
                while self._fg + self._bg + want > self.cores and not (stop is not None and stop()):
                    self._cv.wait(0.02)  # woken by the foreground's end; the timeout re-checks ``stop``
                self.background_wait_seconds += time.perf_counter() - t0
            step = Step(want, preempt)
            self._steps.append(step)
            self._bg += want
        try:
            yield step
        finally:
            with self._cv:
                self._steps.remove(step)
                self._bg -= want
                self._cv.notify_all()


@lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical cores this process may use (hyper-threads do not help llama.cpp's matmuls)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            phys = core = ""
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                    cores.add((phys, core))
    except OSError:
        pass
    n = len(cores) if cores else max(1, (os.cpu_count() or 2) // 2)
    return max(1, min(n, usable))


# Decoding is memory-bound: past ~8 threads it gets no faster and steals cores from the UI.
MAX_DEFAULT_THREADS = 8


def default_threads(requested: int, *, decode: bool = False, model_bytes: int = 0) -> int:
    """``requested`` if > 0, else physical cores capped at MAX_DEFAULT_THREADS.

    ``decode=True`` (token-by-token threads) leaves one core free on machines with 2-4 cores for a
    small model (weights under ``SMALL_MODEL_BYTES``): its decoding is memory-bound and OpenMP threads
    spin-wait, so one busy neighbour (the UI, another process) stalls every step. Measured on a loaded
    2-core VM, SmolLM2 decode: 22 ms/token with 1 thread, 107-135 ms/token with 2 (prefill: 12 vs 14-25
    ms/token). A model of the size we ship decodes faster on every core: a Qwen3-VL-2B-shaped Q4_K_M
    (1.05 GB) on a quiet 2-core machine, 81 ms/token with 2 threads vs 134 with 1
    (shared/notes/llama-cpp-python.md; ``scripts/bench_question.py`` reports both, ``decode_ms``).
    """
    if requested > 0:
        return requested
    n = min(physical_cores(), MAX_DEFAULT_THREADS)
    if decode and 2 <= n <= 4 and model_bytes < SMALL_MODEL_BYTES:
        n -= 1
    return max(1, n)


SMALL_MODEL_BYTES = 512 * 2**20  # below: decoding is spin-stall bound (SmolLM2-135M: 94 MB); above: compute


class ComputeLane:
    """The one thread on which a model runs every computation that uses more than one thread.

    Why: llama.cpp's CPU backend is built with OpenMP, and libgomp keeps one team of worker threads
    per thread that starts a parallel region, for that thread's life. Once a process has more OpenMP
    threads than cores (two teams: the read-ahead thread's and the question's), libgomp stops
    spin-waiting at the barrier after every graph node and sleeps instead, and every multi-threaded
    pass gets slower for good. Measured on the Qwen3-VL-2B stand-in, 2 cores, 2 threads: 86 ms per
    decoded token from the thread that decoded first, 113 ms from any other thread while the first
    lives (``OMP_WAIT_POLICY=passive``: 114 ms everywhere); the app's answer tokens after a photo was
    read ahead took 139 ms against 97 ms raw at the same context length. So each model hands its
    multi-threaded calls to its lane: one team per model, whichever thread asks. A one-thread call
    starts no team and runs on the caller's thread. Idle teams count too: several multi-threaded
    models loaded at once (three 2-thread 2B models: 101 instead of 78 ms/token) are slower than one;
    the engine's agent and prophet fit (the prophet's one thread starts no team on 2 cores).

    ``call(threads, fn, *args)``: ``run`` for a multi-threaded pass, in place for a one-thread one.
    ``run(fn, *args)``: ``fn(*args)`` on the lane's thread (started on first use); the caller waits
    for it, and a KeyboardInterrupt in the caller is re-raised only after the call returned (as when
    the caller ran the C call itself). Closed lanes end their thread (and its OpenMP team).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: list[tuple[Callable[..., object], tuple[object, ...], _Result]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.calls = 0  # calls run on the lane's thread (tests)

    def run(self, fn: Callable[..., T], *args: object) -> T:
        if self._thread is not None and threading.current_thread() is self._thread:
            return fn(*args)
        res = _Result()
        with self._cv:
            if self._closed:
                return fn(*args)  # a model being closed: nothing left to keep on one thread
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"compute-{self.name}", daemon=True)
                self._thread.start()
            self._jobs.append((fn, args, res))
            self._cv.notify()
        interrupted: BaseException | None = None
        while True:
            try:
                res.done.wait()
                break
            except BaseException as e:  # noqa: BLE001 - Ctrl+C: the C call cannot stop half-way
                interrupted = e
        if interrupted is not None:
            raise interrupted
        if res.error is not None:
            raise res.error
        return res.value  # type: ignore[return-value]  # what fn returned

    def call(self, threads: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` for a pass of ``threads`` threads: on the lane when more than one (an OpenMP
        team), else on the caller's thread (one thread starts no team)."""
        return self.run(fn, *args) if threads > 1 else fn(*args)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                fn, args, res = self._jobs.pop(0)
            try:
                res.value = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                res.error = e
            self.calls += 1
            res.done.set()

    def close(self) -> None:
        """End the thread once the calls queued now have run (idempotent)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()


class _Result:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None
