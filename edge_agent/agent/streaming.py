"""One generation run in a worker thread, its pieces yielded as events as they come.

Knows: the worker thread, the queue between it and the consumer, and mirroring the user's cancel event
into the generation's own stop event. Does not know: what is generated (the call is handed in), the
loop, llama.cpp.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any

from edge_agent.agent.events import Event
from edge_agent.runtime.types import Generation


def stream(call: Callable[[Callable[[str, int], None], threading.Event], Generation],
           make_event: Callable[[str], Event | None], cancel: threading.Event) -> Generator[Event, None,
                                                                                            Generation]:
    """Run ``call(on_token, stop)`` in a worker thread and yield ``make_event(piece)`` per streamed piece.

    The session is touched by the worker only while this generator waits for it. ``cancel`` is mirrored
    into the worker's stop event within ~50 ms; closing this generator early stops and joins the worker.
    Returns the Generation (its ``stop_reason`` says whether it was cancelled).
    """
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    stop = threading.Event()
    done = object()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["gen"] = call(lambda piece, tok: q.put(piece), stop)
        except BaseException as e:  # re-raised in the caller's thread below
            box["err"] = e
        finally:
            q.put(done)

    th = threading.Thread(target=work, name="agent-generate", daemon=True)
    th.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.05)
            except queue.Empty:
                if cancel.is_set():
                    stop.set()
                continue
            if item is done:
                break
            ev = make_event(item)
            if ev is not None:
                yield ev
            if cancel.is_set():
                stop.set()
    finally:
        if th.is_alive():
            stop.set()
            th.join()
    if "err" in box:
        raise box["err"]
    gen: Generation = box["gen"]
    return gen
