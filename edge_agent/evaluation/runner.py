"""The runner: every pending (question, mode) through an engine, each record saved before the next.

Knows: the order of work, resuming from ``results.jsonl``, which errors are a question's result
(``EdgeAgentError``) and which are bugs, cancellation. The engine is anything with
``ask(question, image, *, mode=..., seprod=..., cancel=...)`` yielding agent events, created once
per run, lazily, by an injected factory. Does not know: models, llama.cpp, reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edge_agent.agent import events as ev
from edge_agent.errors import EdgeAgentError
from edge_agent.evaluation.dataset import Question, load_dataset
from edge_agent.evaluation.matching import match_answer
from edge_agent.evaluation.metrics import compute_metrics
from edge_agent.evaluation.modes import ModeSpec, parse_modes
from edge_agent.evaluation.store import ResultsStore
from edge_agent.evaluation.summary import make_record


class EngineLike(Protocol):
    def ask(self, question: str, image: Any = None, *, cancel: threading.Event | None = None,
            mode: str | None = None, history: Any = None) -> Iterator[ev.Event]: ...


AskFn = Callable[[Any, ModeSpec, Question, "threading.Event | None"], Iterable[ev.Event]]


def default_ask(engine: Any, mode: ModeSpec, q: Question, cancel: threading.Event | None) -> Iterable[ev.Event]:
    """Run one question on the engine in ``mode``. SeProD is switched per call, models stay loaded."""
    image = str(q.image) if q.image is not None else None
    return engine.ask(q.question, image, cancel=cancel, mode=mode.engine_mode, seprod=mode.seprod)


def library_ask(libraries: dict[str, Any]) -> AskFn:
    """An ``ask`` that scores ``libraries[mode.library]`` (a loaded ``rationales.Library``) for a
    mode with a library column, on the same engine and models; other modes run as ``default_ask``."""
    from edge_agent.agent.loop import AgentOptions  # agent logic only: no model, no network

    def ask(engine: Any, mode: ModeSpec, q: Question, cancel: threading.Event | None) -> Iterable[ev.Event]:
        if not mode.library:
            return default_ask(engine, mode, q, cancel)
        opts = AgentOptions.from_settings(engine.settings, mode=mode.engine_mode, library=libraries[mode.library])
        image = str(q.image) if q.image is not None else None
        return engine.ask(q.question, image, cancel=cancel, mode=mode.engine_mode, seprod=mode.seprod, options=opts)

    return ask


@dataclass
class EvalRun:
    """What ``run_eval`` returns: every record for the chosen questions and modes, and the metrics."""

    dataset: Path
    questions: list[Question]
    modes: list[ModeSpec]
    out_dir: Path
    records: list[dict[str, Any]]
    metrics: dict[str, dict[str, Any]]
    ran: int  # (question, mode) pairs run now; the rest came from results.jsonl
    fingerprint: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[int, int, dict[str, Any] | None], None]  # (done, total, record just finished)


def run_eval(
    dataset: Path | str,
    modes: Sequence[ModeSpec] | str,
    out_dir: Path | str,
    engine_factory: Callable[[], Any],
    *,
    limit: int | None = None,
    fingerprint: dict[str, Any] | None = None,
    ask: AskFn = default_ask,
    on_progress: ProgressFn | None = None,
    on_question: Callable[[Question, ModeSpec], None] | None = None,
    cancel: threading.Event | None = None,
) -> EvalRun:
    """Run every pending (question, mode) and return all records + metrics.

    Order: question by question, every mode for a question before the next question (so an
    interrupted run has compared the modes on the same questions). The engine is created once,
    lazily: a fully resumed run loads no model. Per question, an ``EdgeAgentError`` from the
    engine (a bad image, a context overflow) is recorded as that question's error; anything else
    is a bug and propagates. KeyboardInterrupt propagates too: what finished is already saved.
    """
    dataset = Path(dataset)
    specs = parse_modes(modes) if isinstance(modes, str) else list(modes)
    questions = load_dataset(dataset, limit=limit)
    store = ResultsStore(out_dir).open(fingerprint)
    pending = [(q, m) for q in questions for m in specs if not store.has(m.name, q.id)]
    total = len(questions) * len(specs)
    done = total - len(pending)
    if on_progress:
        on_progress(done, total, None)
    engine = None
    try:
        for q, m in pending:
            if cancel is not None and cancel.is_set():
                break
            if engine is None:
                engine = engine_factory()
            if on_question:
                on_question(q, m)
            started = time.perf_counter()
            collected: list[ev.Event] = []
            error = None
            try:
                for e in ask(engine, m, q, cancel):
                    collected.append(e)
            except EdgeAgentError as e:
                error = str(e)
            if cancel is not None and cancel.is_set():
                break  # a cancelled question is not a result; it reruns next time
            rec = make_record(q, m, collected, wall_seconds=time.perf_counter() - started, error=error)
            store.append(rec)
            done += 1
            if on_progress:
                on_progress(done, total, rec)
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    # Re-score with the answers as they are now (a corrected answer key needs no rerun).
    records = [_rescored(store.records[(m.name, q.id)], q) for q in questions for m in specs if store.has(m.name, q.id)]
    return EvalRun(dataset, questions, specs, Path(out_dir), records, compute_metrics(records, specs),
                   ran=len(pending), fingerprint=fingerprint or {})


def _rescored(rec: dict[str, Any], q: Question) -> dict[str, Any]:
    exact, contains = match_answer(rec["prediction"], q.answers)
    return {**rec, "answers": list(q.answers), "exact": exact, "contains": contains}

