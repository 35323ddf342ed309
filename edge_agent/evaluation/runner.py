"""The runner: every pending (question, mode) through an engine, each record saved before the next.

Knows: the order of work, resuming from ``results.jsonl``, which errors are a question's result
(``EdgeAgentError``) and which are bugs, cancellation. The engine is an ``engine.face.EngineFace``
(``Engine``, or the tests' scripted one), asked one ``AskRequest`` per (question, mode) (two for a
follow-up: its earlier question first, in the same chat), created once per run, lazily, by an injected
factory. Does not know: models, llama.cpp, reports.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edge_agent.agent import events as ev
from edge_agent.core.errors import EdgeAgentError
from edge_agent.engine.face import AskRequest, EngineFace
from edge_agent.evaluation.dataset import Question, load_dataset
from edge_agent.evaluation.matching import match_answer
from edge_agent.evaluation.metrics import compute_metrics
from edge_agent.evaluation.modes import ModeSpec, parse_modes
from edge_agent.evaluation.store import ResultsStore
from edge_agent.evaluation.summary import make_record

AskFn = Callable[[EngineFace, ModeSpec, Question, "threading.Event | None"], Iterable[ev.Event]]


def question_seed(base: int, qid: str) -> int:
    """The random seed question ``qid`` runs with: ``base`` (the ``seed`` setting) plus a number made from
    the id. It does not depend on which questions ran before or where, so a question sampled on a cluster
    worker draws what it draws in a local run."""
    return (base + int(hashlib.sha256(qid.encode("utf-8")).hexdigest()[:8], 16)) % 2**31


def _seed(engine: EngineFace, q: Question) -> int:
    return question_seed(engine.settings.seed if engine.settings is not None else 0, q.id)


def asked(engine: EngineFace, q: Question, request: Callable[..., AskRequest],
          cancel: threading.Event | None) -> Iterable[ev.Event]:
    """``q`` on the engine as ``request(question, image, context=..., history=...)`` builds it. A follow-up
    (``q.follows``) is the second question of a chat: its earlier question is asked first, the same way
    and with no image, and only the follow-up's events are yielded (the earlier answer is not scored;
    its context and the exchange carry on, as for ``ask --continue``)."""
    image = str(q.image) if q.image is not None else None
    if not q.follows:
        return engine.ask(request(q.question, image), cancel=cancel)
    return _followup(engine, q, image, request, cancel)


def _followup(engine: EngineFace, q: Question, image: str | None, request: Callable[..., AskRequest],
              cancel: threading.Event | None) -> Iterator[ev.Event]:
    assert q.follows
    final = None
    for e in engine.ask(request(q.follows, None), cancel=cancel):
        if isinstance(e, ev.FinalAnswer):
            final = e
        elif isinstance(e, ev.AgentError) and e.fatal:
            raise EdgeAgentError(f"The question before follow-up {q.id} failed: {e.title}: {e.message}")
    if final is None:
        if cancel is not None and cancel.is_set():
            return
        raise EdgeAgentError(f"The question before follow-up {q.id} ended without an answer.")
    history = ((q.follows, final.answer),) if final.answer else ()
    engine.settle()  # as between records: the earlier answer's state save is not the follow-up's time
    yield from engine.ask(request(q.question, image, context=final.context or None, history=history),
                          cancel=cancel)


def _requests(mode: ModeSpec, **fixed: Any) -> Callable[..., AskRequest]:
    """Builds the ``AskRequest`` of a question in ``mode`` for :func:`asked`, with ``fixed`` (its seed, or
    the options of an ablation or a library)."""
    return lambda question, image, **chat: AskRequest(question, image, mode=mode.engine_mode,
                                                      seprod=mode.seprod, **fixed, **chat)


def default_ask(engine: EngineFace, mode: ModeSpec, q: Question,
                cancel: threading.Event | None) -> Iterable[ev.Event]:
    """Run one question on the engine in ``mode``. SeProD is switched per call, models stay loaded; an
    ablation (index-only, a smaller library) runs with options that differ in that one thing."""
    if not mode.is_ablation:
        return asked(engine, q, _requests(mode, seed=_seed(engine, q)), cancel)
    opts = ablation_options(engine.settings, mode, seed=_seed(engine, q), library=engine.library)
    return asked(engine, q, _requests(mode, options=opts), cancel)


def ablation_options(settings: Any, mode: ModeSpec, *, seed: int, library: Any = None) -> Any:
    """The agent options of an ablation mode: the settings' options but index-only scoring, or the
    one-rationale library (``k1``), or only ``keep_ids`` of the library the settings name."""
    from edge_agent.agent.loop import AgentOptions  # agent logic only: no model, no network
    from edge_agent.agent.rationales import Library, builtin_library, load_library

    lib: Library = library if library is not None else load_library(settings.rationales)
    if mode.ablation_library:
        lib = builtin_library(mode.ablation_library)
    elif mode.keep_ids:
        lib = Library(tuple(r for r in lib if r.id in mode.keep_ids),
                      f"{lib.source} ({', '.join(mode.keep_ids)})")
    return AgentOptions.from_settings(settings, mode=mode.engine_mode, seed=seed, library=lib,
                                      index_only=mode.index_only or settings.ssr_index_only)


def library_ask(libraries: dict[str, Any]) -> AskFn:
    """An ``ask`` that scores ``libraries[mode.library]`` (a loaded ``rationales.Library``) for a
    mode with a library column, on the same engine and models; other modes run as ``default_ask``."""
    from edge_agent.agent.loop import AgentOptions  # agent logic only: no model, no network

    def ask(engine: EngineFace, mode: ModeSpec, q: Question,
            cancel: threading.Event | None) -> Iterable[ev.Event]:
        if not mode.library:
            return default_ask(engine, mode, q, cancel)
        opts = AgentOptions.from_settings(engine.settings, mode=mode.engine_mode,
                                          library=libraries[mode.library],
                                          seed=_seed(engine, q))
        return asked(engine, q, _requests(mode, options=opts), cancel)

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
    model_files: dict[str, str] = field(default_factory=dict)  # role -> the file loaded (run.json keeps them)
    cluster: dict[str,
                  # a cluster run: workers, threads, nodes (edge_agent.evaluation.cluster.RayWorkers.info)
                  Any] | None = None


ProgressFn = Callable[[int, int, dict[str, Any] | None], None]  # (done, total, record just finished)
Work = list[tuple[Question, list[ModeSpec]]]  # each pending question with the modes it still needs


class Workers(Protocol):
    """Runs pending work somewhere else (``edge_agent.evaluation.cluster.RayWorkers``): yields each question's
    records as they arrive, in any order; ``model_files`` and ``info`` describe what ran them."""

    model_files: dict[str, str]

    def run(self, work: Work, cancel: threading.Event | None) -> Iterator[list[dict[str, Any]]]: ...

    def info(self) -> dict[str, Any]: ...


def run_question(engine: EngineFace, q: Question, modes: Sequence[ModeSpec], ask: AskFn = default_ask,
                 cancel: threading.Event | None = None,
                 on_question: Callable[[Question, ModeSpec], None] | None = None) -> Iterator[dict[str, Any]]:
    """Question ``q`` in each of ``modes``, in order: one record per mode as it finishes. The one code
    path of a local eval and a cluster worker. An ``EdgeAgentError`` (a bad image, a context overflow) is
    the record's error; anything else is a bug and propagates. A cancelled question yields nothing."""
    for m in modes:
        if cancel is not None and cancel.is_set():
            return
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
            return  # a cancelled question is not a result; it reruns next time
        wall = time.perf_counter() - started
        # the answer's state is saved in the background: waited for here, outside every record's time, so
        # that the next mode's question does not pay for this one's (in the app a person reads the answer)
        engine.settle()
        yield make_record(q, m, collected, wall_seconds=wall, error=error)


def run_eval(
    dataset: Path | str,
    modes: Sequence[ModeSpec] | str,
    out_dir: Path | str,
    engine_factory: Callable[[], EngineFace],
    *,
    limit: int | None = None,
    fingerprint: dict[str, Any] | None = None,
    ask: AskFn = default_ask,
    on_progress: ProgressFn | None = None,
    on_question: Callable[[Question, ModeSpec], None] | None = None,
    cancel: threading.Event | None = None,
    workers: Workers | None = None,
) -> EvalRun:
    """Run every pending (question, mode) and return all records + metrics.

    Order: question by question, every mode for a question before the next question (so an
    interrupted run has compared the modes on the same questions). The engine is created once,
    lazily: a fully resumed run loads no model. ``workers`` (a cluster): the questions run there
    instead, each on one worker, and their records are stored as they come back. Per question, an
    ``EdgeAgentError`` from the engine is recorded as that question's error; anything else is a bug
    and propagates. KeyboardInterrupt propagates too: what finished is already saved.
    """
    dataset = Path(dataset)
    specs = parse_modes(modes) if isinstance(modes, str) else list(modes)
    questions = load_dataset(dataset, limit=limit)
    store = ResultsStore(out_dir).open(fingerprint)
    work = [(q, todo) for q in questions if (todo := [m for m in specs if not store.has(m.name, q.id)])]
    total = len(questions) * len(specs)
    pending = sum(len(todo) for _, todo in work)
    done = total - pending
    if on_progress:
        on_progress(done, total, None)
    local = _Local(engine_factory, ask, on_question)
    source = workers.run(work, cancel) if workers is not None else local.run(work, cancel)
    try:
        for recs in source:
            for rec in recs:
                store.append(rec)
                done += 1
                if on_progress:
                    on_progress(done, total, rec)
    finally:
        getattr(source, "close", lambda: None)()  # stops the workers / closes the engine, also on Ctrl+C
        files = (workers or local).model_files
        if files:
            store.note("model_files", files)
    # Re-score with the answers as they are now (a corrected answer key needs no rerun).
    records = [_rescored(store.records[(m.name, q.id)],
                         q) for q in questions for m in specs if store.has(m.name, q.id)]
    return EvalRun(dataset, questions, specs, Path(out_dir), records, compute_metrics(records, specs),
                   ran=pending, fingerprint=fingerprint or {}, model_files=store.noted("model_files") or {},
                   cluster=workers.info() if workers is not None else None)


class _Local:
    """The questions in this process, on one engine made by ``factory`` when the first one starts."""

    def __init__(self, factory: Callable[[], EngineFace], ask: AskFn,
                 on_question: Callable[[Question, ModeSpec], None] | None) -> None:
        self.factory, self.ask, self.on_question = factory, ask, on_question
        self.model_files: dict[str, str] = {}

    def run(self, work: Work, cancel: threading.Event | None) -> Iterator[list[dict[str, Any]]]:
        engine: EngineFace | None = None
        try:
            for q, todo in work:
                if cancel is not None and cancel.is_set():
                    break
                if engine is None:
                    engine = self.factory()
                    self.model_files = dict(engine.model_files())
                for rec in run_question(engine, q, todo, self.ask, cancel, self.on_question):
                    yield [rec]
        finally:
            if engine is not None:
                engine.close()


def _rescored(rec: dict[str, Any], q: Question) -> dict[str, Any]:
    exact, contains = match_answer(rec["prediction"], q.answers)
    return {**rec, "answers": list(q.answers), "exact": exact, "contains": contains}

