"""Waiting in tests: on a condition, never for a fixed time.

``wait_until`` polls a predicate from plain test code (a subprocess's output file, a server's request
count); ``pilot_wait_until`` does the same inside a Textual app test, letting the app run between
checks. Both fail with an AssertionError naming what never happened, after ``timeout`` seconds
(generous: on a loaded 2-core CI machine things are slow, and a passing wait returns at once).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator


def _attempts(timeout: float, what: str) -> Iterator[None]:
    """Yields until ``timeout`` seconds have passed, then raises; the caller checks once per yield."""
    deadline = time.monotonic() + timeout
    while True:
        yield
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_until(predicate: Callable[[], object], *, timeout: float = 10.0, interval: float = 0.01,
               what: str = "the expected state") -> None:
    """Return as soon as ``predicate()`` is true (checked every ``interval`` seconds)."""
    for _ in _attempts(timeout, what):
        if predicate():
            return
        time.sleep(interval)


async def pilot_wait_until(pilot, predicate: Callable[[], object], *, timeout: float = 10.0,
                           interval: float = 0.05, what: str = "the app to reach the expected state") -> None:
    """``wait_until`` for a Textual ``Pilot``: the app keeps processing messages between checks."""
    for _ in _attempts(timeout, what):
        if predicate():
            return
        await pilot.pause(interval)


def signal_when(proc: subprocess.Popen, predicate: Callable[[], object], sig: int, *, timeout: float = 300.0,
                what: str = "the expected state") -> None:
    """Send ``sig`` to a child process as soon as ``predicate()`` holds (or the child has ended), and wait
    for it to end; it never outlives the call (killed if ``sig`` does not end it within 60 s)."""
    try:
        wait_until(lambda: predicate() or proc.poll() is not None, timeout=timeout, interval=0.005, what=what)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
