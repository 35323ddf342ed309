"""SSR's neutral scores: each rationale's mean log-prob after a neutral question, once per model and library.

Why: the paper's score (a rationale's mean token log-prob after the context) also measures how likely
the rationale's words are anywhere: on an instruct model not trained for SSR, "I should search the web
for facts" won whatever the context held (the search had just found the fact). Domain-conditional PMI
(Holtzman et al. 2021, "Surface Form Competition") divides that out: score = mean log p(c | context) -
mean log p(c | neutral context), where the neutral context is the same system prompt followed by a user
turn with an empty question. That baseline depends only on the model, the system prompt and the
candidate texts: it is computed once (one short user turn and one scoring pass after the system prompt)
and kept in ``home/neutral-scores.json``, keyed by the model's identity (file, KV type, build: what
changes the numbers), the system prompt and the neutral question.

Knows: the neutral question, the key, the file, how to read the scores on a session holding exactly a
system prompt. Does not know: the loop, selection, llama.cpp (a ``SessionLike`` is handed in).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_agent.agent.context import append_segments
from edge_agent.agent.prompts import question_segments
from edge_agent.core.files import atomic_write
from edge_agent.runtime.types import SessionLike

# the user turn of the neutral context: "<|im_start|>user\n<|im_end|>\n" then "<think>\n"
NEUTRAL_QUESTION = ""
FILE_NAME = "neutral-scores.json"
MAX_ENTRIES = 64  # (model, system prompt) pairs kept; the oldest go first

Score = Callable[[str, Sequence[str]], Sequence[float]]  # (system prompt, candidates) -> neutral means


def neutral_means(s: SessionLike, texts: Sequence[str]) -> list[float]:
    """Each of ``texts``' mean log-prob after the neutral question, on a session holding exactly a system
    prompt (one short user turn and one scoring pass; the session is rolled back to where it was)."""
    cp = s.checkpoint()
    try:
        append_segments(s, question_segments(NEUTRAL_QUESTION, None))
        return [sc.mean for sc in s.score(texts)]
    finally:
        s.rollback(cp)


def neutral_key(identity: Mapping[str, Any], system: str) -> str:
    blob = json.dumps({"identity": dict(identity), "system": system, "question": NEUTRAL_QUESTION},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class NeutralScores:
    """Neutral means per candidate text, in memory and on disk (``path``; None: memory only)."""

    def __init__(self, identity: Mapping[str, Any], path: Path | None) -> None:
        self.identity, self.path = dict(identity), path
        self._lock = threading.RLock()  # a scoring may reach get() again (the system prompt first read)
        self._keys: dict[str, str] = {}  # system prompt -> neutral_key (a JSON dump and a hash: ~0.1 ms each)
        self._table: dict[str, dict[str, float]] = self._read()

    def _read(self) -> dict[str, dict[str, float]]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {str(k): {str(t): float(v) for t, v in row.items()} for k, row in data.items()}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}  # none yet, or unreadable: computed again (a few hundred ms) and rewritten

    def row(self, system: str) -> dict[str, float]:
        """The neutral means known after ``system`` (candidate text -> mean): the live dict, filled in place
        by :meth:`add`, so a question's options can hold it before its context opens."""
        with self._lock:
            key = self._keys.get(system)
            if key is None:
                key = self._keys[system] = neutral_key(self.identity, system)
            return self._table.setdefault(key, {})

    def missing(self, system: str, texts: Sequence[str]) -> list[str]:
        row = self.row(system)
        return [t for t in dict.fromkeys(texts) if t not in row]

    def add(self, system: str, texts: Sequence[str], means: Sequence[float]) -> None:
        with self._lock:
            self.row(system).update(zip(texts, map(float, means), strict=True))
            self._save()

    def get(self, system: str, texts: Sequence[str], score: Score) -> dict[str, float]:
        """The neutral mean of each of ``texts`` after ``system``; the missing ones scored with ``score``."""
        with self._lock:
            if missing := self.missing(system, texts):
                self.add(system, missing, score(system, missing))
            row = self.row(system)
            return {t: row[t] for t in texts}

    def _save(self) -> None:
        if self.path is None:
            return
        while len(self._table) > MAX_ENTRIES:
            self._table.pop(next(iter(self._table)))
        try:
            atomic_write(self.path, json.dumps(self._table, indent=0, sort_keys=False) + "\n")
        except OSError:
            pass  # a read-only or full home: kept in memory for this process, computed again next time
