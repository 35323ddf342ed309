"""`eval --cluster`: the run in a child process that this one watches, so that losing Ray's node is said.

Ray ends a driver whose node dies (its raylet, or an agent of it, stopped) from inside its C++ core, with
nothing Python can catch: the person saw Ray's log lines and exit status 1. So a cluster eval started from
the command line runs the same command in a child process (its own process group: Ctrl+C reaches this
one, which passes it on once); the child writes a status file when it ends on its own (finished, an
error it reported, interrupted). A child that ends without writing it was ended by Ray: this process
then says what was lost, that every finished result is kept, and that running the command again
resumes. Knows processes, signals and that status file; not Ray, models or the eval's records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from edge_agent.core.errors import EdgeAgentError

STATUS = "EDGE_AGENT_EVAL_STATUS"  # the child's status file (set: this process is the watched child)


def watched() -> bool:
    """This process is the child a watcher started."""
    return bool(os.environ.get(STATUS))


def mark_done(outcome: str) -> None:
    """The child ends on its own (``outcome``: finished, error, interrupted): the watcher need say nothing."""
    path = os.environ.get(STATUS)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(json.dumps({"outcome": outcome}), encoding="utf-8")


def run_watched(argv: list[str], results: Path, counts: Callable[[], tuple[int, int]]) -> int:
    """Run ``edge-agent ARGV`` as a watched child; its exit status, after saying what was lost when Ray ended
    it (raises EdgeAgentError). ``counts()``: (results saved, results in all) once it has ended."""
    fd, status = tempfile.mkstemp(prefix="edge-agent-eval-", suffix=".json")
    os.close(fd)
    os.unlink(status)
    child = subprocess.Popen([sys.executable, "-m", "edge_agent.commands.cli", *argv], env={**os.environ,
                                                                                   STATUS: status},
                             process_group=0)
    previous = signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    try:
        rc = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        if child.poll() is None:
            child.kill()
            child.wait()
    ended_itself = Path(status).exists()
    with contextlib.suppress(OSError):
        os.unlink(status)
    if ended_itself or rc == 0:
        return rc
    saved, total = counts()
    raise EdgeAgentError(
        f"Ray lost the node this run's driver ran on and ended it (exit status {rc}; Ray marks a node dead "
        f"when its raylet or one of its agents stops: its lines above say which). The questions running then "
        f"were not finished. {saved} of {total} results are saved in {results} and kept. Run the same "
        f"command again to "
        "resume (start the cluster again first if you started it yourself).", title="Ray lost a node")
