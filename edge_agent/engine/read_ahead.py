"""Read-ahead in the background: one worker thread that reads what the person has given so far (an
attached photo, the whole words typed) into the chat's pending user turn while they type.

Knows: the latest thing asked for (a :class:`Target`: which chat, which images, which words), how often
to act on it (an image and a finished-looking question at once; other words after a short quiet
``debounce``, so a paste followed by edits is read once), and the one rule that makes it background
work: the question is the foreground. Nothing is read while a question runs; when one is sent,
:meth:`Reader.paused` lets a step in flight finish (it is the question's own images or words: an image
is never decoded twice, and words read are words the question need not read), takes the context and
holds it until the answer is done; targets taken before it are dropped. Does not know models, chats or
prompts: the engine hands it the step to run (``Engine._read_ahead_step`` -> ``ChatContexts.read_ahead``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from edge_agent.core.errors import Cancelled, EdgeAgentError

State = TypeVar("State")

DEBOUNCE = 0.15  # seconds of quiet before changed words are read (a word typed takes ~0.3 s)


@dataclass(frozen=True)
class Target:
    """What to read ahead: the chat it continues ('' a new chat), the attached image files, the words."""

    context: str
    images: tuple[str, ...]
    text: str
    closed: bool = False  # ``text`` is the whole question: the end of the user turn is read too


ENDS = ("?", "!", ".")  # a question ending in one of these is taken as finished (until more is typed)


def stable_prefix(text: str) -> tuple[str, bool]:
    """The whole words of a question being typed, and whether it looks finished: everything up to the
    last space (the last word may still change), with the outer spaces the question will lose when it
    is sent; a question whose last character is ``?``, ``!`` or ``.`` is whole (``True``), so its last
    word and the end of the turn are read too and Enter leaves nothing to read (typing on rolls that
    end back, as any edit does)."""
    t = text.strip()
    if t.endswith(ENDS) and text == text.rstrip():
        return t, True
    t = text.lstrip()
    cut = max(t.rfind(" "), t.rfind("\n"), t.rfind("\t"))
    return (t[:cut].rstrip() if cut > 0 else ""), False


class Reader(Generic[State]):
    """The read-ahead worker of one engine. ``step(target, stop)`` reads ``target`` into the context
    (``stop`` set, on close: stop a text step now, raising ``Cancelled``) and returns what is read ahead."""

    def __init__(self, step: Callable[[Target, threading.Event], State | None], *,
                 debounce: float = DEBOUNCE) -> None:
        self._step, self.debounce = step, debounce
        self._cv = threading.Condition()
        self._context = threading.Lock()  # held by a step, or by a question from start to answer
        self._stop = threading.Event()
        self._target: Target | None = None
        self._done: Target | None = None  # the target the context holds now
        self._changed = 0.0  # when the target last changed (monotonic)
        self._epoch = 0  # counts questions: a target taken before one began is stale after it
        self._paused = 0
        self._busy = False  # a step is running
        self._closed = False
        self._thread: threading.Thread | None = None
        self.state: State | None = None  # what the last step left read ahead
        self.error: BaseException | None = None  # a bug in a step (re-raised by paused() and close())

    def want(self, target: Target | None) -> None:
        """Read ``target`` ahead (replacing any earlier one); None: nothing new to read. Returns at once."""
        with self._cv:
            if self._closed or target == self._target:
                return
            self._target, self._changed = target, time.monotonic()
            if self._thread is None and target is not None:
                self._thread = threading.Thread(target=self._loop, name="read-ahead", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait until the latest target is read (or nothing is asked for); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._closed and (self._busy or (self._target is not None and self._target != self._done
                                                       and not self._paused)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The question: wait for a step in flight, then hold the context until the block ends.
        Afterwards the context holds the answered chat: the next target is read afresh."""
        with self._cv:  # no notify: waking the worker only to find it paused costs the question a GIL handoff
            self._paused += 1
            self._epoch += 1
            self._target = None
        self._context.acquire()
        try:
            if self.error is not None:
                raise self.error
            yield
        finally:
            self._context.release()
            with self._cv:
                self._paused -= 1
                self._done, self.state = None, None
                self._cv.notify_all()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the context a moment between two steps (a step in flight finishes first; none starts
        meanwhile), keeping what is asked for and what is read: the read-ahead goes on afterwards. Loading
        the prophet changes the agent's threads under it; :meth:`paused` there dropped a target the worker
        had not begun (a loaded machine): `ask` then read the photo at Enter."""
        with self._context:
            if self.error is not None:
                raise self.error
            yield

    def close(self) -> None:
        """Stop the worker (a text step in flight is stopped: its partial cells are removed) and join it."""
        with self._cv:
            self._closed = True
            self._stop.set()
            self._cv.notify_all()
            th = self._thread
        if th is not None:
            th.join()

    # ---- the worker ---------------------------------------------------------------------------------
    def _next(self) -> tuple[Target, int] | None:
        """The next target to read, after its debounce; None when closed."""
        with self._cv:
            while True:
                if self._closed:
                    return None
                t = self._target
                if self._paused or t is None or t == self._done:
                    self._cv.wait()
                    continue
                d = self._done
                left = self._changed + self.debounce - time.monotonic()
                same = d is not None and (d.context, d.images) == (t.context, t.images)
                if same and not t.closed and left > 0:
                    self._cv.wait(left)  # only the words changed: wait for a quiet moment
                    continue
                self._busy = True
                return t, self._epoch

    def _loop(self) -> None:
        while (got := self._next()) is not None:
            t, epoch = got
            state, done = None, False
            try:
                with self._context:
                    if epoch == self._epoch and not self._closed:
                        state, done = self._step(t, self._stop), True
            except Cancelled:
                pass  # a question took over: it evaluates the rest itself
            except EdgeAgentError:
                done = True  # e.g. an image that cannot be read: the question reports it
            except BaseException as e:  # a bug: kept for the question's thread to raise
                self.error, done = e, True
            with self._cv:
                self._busy = False
                if done and epoch == self._epoch:
                    self._done, self.state = t, state
                self._cv.notify_all()
            if self.error is not None:
                return
