"""The progress of `edge-agent eval` on stderr.

On a terminal one line is redrawn in place; when stderr is a pipe or a file (a CI log, `2> log`,
`| tee`) every finished result prints its own line, so the log shows the run as it went. Both
say: results done / total, the last result, the rate, the time left, failures, and on a cluster
what each worker has done (and how often Ray restarted it). Knows nothing of how results are made.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60
                                                                   else f"{s}s")


class EvalProgress:
    """A ``ProgressFn`` for ``run_eval`` (``progress(done, total, record)``) plus ``status(text)`` for the
    engine's loading steps. ``workers``: a function returning per-worker stats (a cluster run)."""

    def __init__(self, results_path: Any, *, stream: TextIO | None = None,
                 workers: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.results_path, self.workers = results_path, workers
        self.total = self.done = self.failures = 0
        self.start_done, self.t0 = 0, time.monotonic()
        self.last = ""
        self._drawn = False

    def status(self, text: str) -> None:
        """A step before the first result (loading the models): redrawn on a terminal, a line in a log."""
        self.last = text
        if self.tty:
            self._draw()
        else:
            self._print(f"eval: {text}")

    def working(self, text: str) -> None:
        """What runs now (``svqa-001 ssr ...``): shown on a terminal; a log gets the result's line instead."""
        self.last = text
        if self.tty:
            self._draw()

    def __call__(self, done: int, total: int, rec: dict[str, Any] | None) -> None:
        self.done, self.total = done, total
        if rec is None:  # the start: what a resumed run already had
            self.start_done, self.t0 = done, time.monotonic()
            if done and done < total:
                self._print(f"Resuming: {done} of {total} results already in {self.results_path}.")
            return
        self.failures += bool(rec.get("error"))
        mark = "error" if rec.get("error") else ("ok" if rec["exact"] else ("~" if rec["contains"] else "x"))
        self.last = f"{rec['id']} {rec['mode']} {mark}"
        if self.tty:
            self._draw()
        else:
            self._print(self.line())

    def line(self) -> str:
        """``eval 3/8 (38%) svqa-001 ssr ok | 0.52/s, 10s left | 0 failed | w1 ip 2, w2 ip 1 (1 restart)``"""
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        parts = [f"eval {self.done}/{self.total}{pct} {self.last}".rstrip()]
        ran, elapsed = self.done - self.start_done, time.monotonic() - self.t0
        if ran and elapsed > 0:
            rate = ran / elapsed
            parts.append(f"{rate:.2f}/s, {_duration((self.total - self.done) / rate)} left")
        parts.append(f"{self.failures} failed")
        if self.workers is not None:
            per = []
            for k, w in enumerate(self.workers(), 1):
                again = f" ({w['restarts']} restart{'s' * (w['restarts'] != 1)})" if w["restarts"] else ""
                per.append(f"w{k} {w['node'].split(' ')[0]} {w['done']}{again}")
            if per:
                parts.append(", ".join(per))
        return " | ".join(parts)

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        self.stream.write("\r\x1b[2K" + self.line())
        self.stream.flush()
        self._drawn = True

    def _print(self, text: str) -> None:
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()
