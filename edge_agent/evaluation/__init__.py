"""Evaluation: answer quality and latency of free-form, SSR and SSR+SeProD on one question set.

What this package knows: the question-set format (JSONL ``{id, image, question, answers: [...]}``
with image paths relative to the file), the agent's event stream (``edge_agent.agent.events``),
how to turn one question's events into a result record, how to aggregate records into metrics
per mode, and how to write the results JSON, a Markdown report and a PNG plot. It runs questions
through an *engine* it is handed (anything with ``ask(question, image, *, mode=..., ...)`` that
yields agent events), created once per run by an injectable factory.

What it does not know: models, llama.cpp, Textual, the network. It never imports them; matplotlib
(the ``plot`` extra) is imported only when a plot is drawn, and its absence is reported, not fatal.

Resumability: every finished (question, mode) is appended to ``OUT/results.jsonl`` (one line,
flushed and fsynced) before the next starts; a rerun skips what is there. ``OUT/run.json`` holds
the settings that change results, and a rerun with different ones is refused, so a results file
never mixes two configurations. Metrics are always computed from ``results.jsonl``, so an
interrupted-and-resumed run reports exactly what one uninterrupted run would.

Modules, in the order data flows through them:

- ``modes``     ``ModeSpec``, ``MODES``, ``parse_modes``, ``with_libraries``
- ``dataset``   ``Question``, ``load_dataset``, ``dataset_name``
- ``summary``   one question's events -> a record (``summarize_events``, ``make_record``)
- ``matching``  ``normalize_answer``, ``match_answer``
- ``store``     ``ResultsStore``: ``results.jsonl`` + ``run.json``
- ``runner``    ``run_eval`` -> ``EvalRun``; ``run_question`` (one question in its modes: the code path
                of a local run and of a cluster worker, ``edge_agent.evaluation.cluster``); ``question_seed``
- ``metrics``   ``compute_metrics``, ``mode_metrics``
- ``report``    ``write_outputs``: ``results.json`` + ``report.md`` (+ ``plot.write_plot``)

Callers import the names below from ``edge_agent.evaluation``.
"""

from __future__ import annotations

from edge_agent.evaluation.dataset import DatasetError, Question, dataset_name, load_dataset
from edge_agent.evaluation.matching import match_answer, normalize_answer
from edge_agent.evaluation.metrics import (
    CACHE_HIT_STATUSES,
    OFFLINE_OK_STATUSES,
    SEARCH_STATUSES,
    TIMING_KEYS,
    compute_metrics,
    distribution,
    mode_metrics,
    percentile,
    wilson,
)
from edge_agent.evaluation.modes import MODES, ModeSpec, parse_modes, with_libraries
from edge_agent.evaluation.plot import write_plot
from edge_agent.evaluation.report import JSON_FILE, PLOT_FILE, REPORT_FILE, render_report, write_outputs
from edge_agent.evaluation.runner import (
    AskFn,
    EvalRun,
    ProgressFn,
    Work,
    Workers,
    default_ask,
    library_ask,
    question_seed,
    run_eval,
    run_question,
)
from edge_agent.evaluation.store import RESULTS_FILE, RUN_FILE, ResultsStore
from edge_agent.evaluation.summary import make_record, summarize_events

__all__ = [
    "CACHE_HIT_STATUSES",
    "JSON_FILE",
    "MODES",
    "OFFLINE_OK_STATUSES",
    "PLOT_FILE",
    "REPORT_FILE",
    "RESULTS_FILE",
    "RUN_FILE",
    "SEARCH_STATUSES",
    "TIMING_KEYS",
    "AskFn",
    "DatasetError",
    "EvalRun",
    "ModeSpec",
    "ProgressFn",
    "Work",
    "Workers",
    "Question",
    "ResultsStore",
    "compute_metrics",
    "dataset_name",
    "default_ask",
    "distribution",
    "library_ask",
    "load_dataset",
    "make_record",
    "match_answer",
    "mode_metrics",
    "wilson",
    "normalize_answer",
    "parse_modes",
    "percentile",
    "question_seed",
    "render_report",
    "run_eval",
    "run_question",
    "summarize_events",
    "with_libraries",
    "write_outputs",
    "write_plot",
]
