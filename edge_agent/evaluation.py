"""Evaluation: answer quality and latency of free-form, SSR and SSR+SeProD on one question set.

What this module knows: the question-set format (JSONL ``{id, image, question, answers: [...]}``
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
"""

from __future__ import annotations

import json
import math
import os
import re
import string
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edge_agent.agent import events as ev
from edge_agent.errors import ConfigError, EdgeAgentError

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
JSON_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "plot.png"

# Search outcome statuses (ToolFinished.status, see tools/search.py): live (the network), cached,
# stale (network down, an old cached entry), offline (a cache miss with --offline), unconfigured
# (no backend: the same answer online and offline), error.
CACHE_HIT_STATUSES = frozenset({"cached", "stale"})
SEARCH_STATUSES = frozenset({"live", "cached", "stale", "offline", "unconfigured", "error"})
# A question "ran entirely from the cache" when every search it made ended in one of these.
OFFLINE_OK_STATUSES = CACHE_HIT_STATUSES | {"unconfigured"}


class DatasetError(EdgeAgentError):
    title = "Bad question set"


# --------------------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeSpec:
    """One evaluated configuration: the agent's reasoning mode and whether SeProD drafts."""

    name: str  # canonical: freeform | ssr | ssr+seprod
    engine_mode: str  # what the engine's ``mode`` takes: freeform | ssr
    seprod: bool


MODES: dict[str, ModeSpec] = {
    "freeform": ModeSpec("freeform", "freeform", False),
    "ssr": ModeSpec("ssr", "ssr", False),
    "ssr+seprod": ModeSpec("ssr+seprod", "ssr", True),
}
_MODE_ALIASES = {"free-form": "freeform", "free_form": "freeform", "react": "freeform", "seprod": "ssr+seprod"}


def parse_modes(text: str | Sequence[str]) -> list[ModeSpec]:
    """``"freeform,ssr,ssr+seprod"`` (any case, ``free-form`` accepted) -> specs, in order, deduplicated."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    out: list[ModeSpec] = []
    for raw in parts:
        key = raw.strip().lower().replace(" ", "")
        if not key:
            continue
        key = _MODE_ALIASES.get(key, key)
        if key not in MODES:
            raise ConfigError(f"Unknown eval mode {raw.strip()!r}. Choose from: {', '.join(MODES)} (comma-separated).")
        if MODES[key] not in out:
            out.append(MODES[key])
    if not out:
        raise ConfigError(f"No eval mode given. Pass --modes with any of: {', '.join(MODES)}.")
    return out


# --------------------------------------------------------------------------------------------------
# Question sets
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]
    image: Path | None  # absolute; None for a text-only question


def dataset_name(path: Path | str) -> str:
    """A short name for a question set: the file's stem, or its folder's name for a generic DATA.jsonl."""
    path = Path(path)
    generic = {"data", "dataset", "questions", "test", "val", "eval"}
    return path.resolve().parent.name if path.stem.lower() in generic else path.stem


def load_dataset(path: Path | str, *, limit: int | None = None) -> list[Question]:
    """Read and validate a JSONL question set; every problem names its line and how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"Question file not found: {path}. Pass a JSONL file with one {{id, image, question, answers}} per line.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text ({e}).") from e
    base = path.resolve().parent
    out: list[Question] = []
    seen: set[str] = set()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where} is not valid JSON ({e.msg}). Each line must be one JSON object.") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where} must be a JSON object with id, image, question, answers.")
        qid = row.get("id")
        if isinstance(qid, int) and not isinstance(qid, bool):
            qid = str(qid)
        if not isinstance(qid, str) or not qid.strip():
            raise DatasetError(f"{where}: 'id' must be a non-empty string.")
        if qid in seen:
            raise DatasetError(f"{where}: id {qid!r} appears twice. Ids must be unique (results are keyed by id).")
        seen.add(qid)
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: 'question' must be a non-empty string.")
        answers = row.get("answers")
        if isinstance(answers, str):
            answers = [answers]
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in answers)
        ):
            raise DatasetError(f"{where}: 'answers' must be a non-empty list of strings (any of them counts as correct).")
        image_raw = row.get("image")
        image: Path | None = None
        if image_raw not in (None, ""):
            if not isinstance(image_raw, str):
                raise DatasetError(f"{where}: 'image' must be a path string (relative to {path.name}) or null.")
            image = (base / image_raw).resolve()
            if not image.is_file():
                raise DatasetError(f"{where}: image {image_raw} not found at {image}. Image paths are relative to the folder of {path.name}.")
        out.append(Question(qid, question.strip(), tuple(str(a) for a in answers), image))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DatasetError(f"{path} holds no questions.")
    return out


# --------------------------------------------------------------------------------------------------
# Answer matching
# --------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "“”‘’«»…–—"})


def normalize_answer(text: str) -> str:
    """Lower case, punctuation to spaces, articles dropped, whitespace collapsed (SQuAD-style)."""
    text = str(text).lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def match_answer(prediction: str, answers: Iterable[str]) -> tuple[bool, bool]:
    """(exact, contains): normalised prediction equals / contains (on word boundaries) any answer."""
    pred = normalize_answer(prediction)
    exact = contains = False
    for a in answers:
        gold = normalize_answer(a)
        if not gold:
            continue
        if pred == gold:
            exact = contains = True
            break
        if f" {gold} " in f" {pred} ":
            contains = True
    return exact, contains


# --------------------------------------------------------------------------------------------------
# One question's events -> a record
# --------------------------------------------------------------------------------------------------


def summarize_events(events: Iterable[ev.Event]) -> dict[str, Any]:
    """Fold one question's event stream into the plain-data part of a result record.

    Per turn: the chosen rationale (SSR), the action taken, and reasoning / action / tool /
    observe seconds. Per question: tool calls by name, search outcome statuses, SeProD acceptance,
    the final answer. Model time = the episode's total minus tool time when the final answer
    carries totals (so the prompt's prefill and evaluating observations count: the model did that
    work), else reasoning + action + observe summed over turns.
    """
    turns: dict[int, dict[str, Any]] = {}

    def turn(n: int) -> dict[str, Any]:
        return turns.setdefault(
            n,
            {"turn": n, "action": None, "rationale": None, "rationale_action": None, "rationale_prob": None,
             "scoring_seconds": None, "reasoning_seconds": None, "action_seconds": None, "tool_seconds": None,
             "observe_seconds": None},
        )

    tools: Counter[str] = Counter()
    searches: list[dict[str, str]] = []
    drafts = {"rounds": 0, "accepted": 0, "drafted": 0}
    final: ev.FinalAnswer | None = None
    errors: list[str] = []
    fatal: str | None = None
    for e in events:
        if isinstance(e, ev.RationaleScored):
            t = turn(e.turn)
            chosen = e.candidates[e.chosen]
            t.update(rationale=chosen.id, rationale_action=chosen.action, rationale_prob=chosen.prob,
                     scoring_seconds=e.seconds)
        elif isinstance(e, ev.ToolCalled):
            tools[e.name] += 1
        elif isinstance(e, ev.ToolFinished):
            if "search" in e.name:  # text_search, image_search (zoom is local)
                searches.append({"name": e.name, "status": e.status})
        elif isinstance(e, ev.DraftVerified):
            drafts["rounds"] += 1
            drafts["accepted"] += e.accepted
            drafts["drafted"] += e.drafted
        elif isinstance(e, ev.TurnFinished):
            turn(e.turn).update(action=e.action, reasoning_seconds=e.reasoning_seconds,
                                action_seconds=e.action_seconds, tool_seconds=e.tool_seconds,
                                observe_seconds=getattr(e, "observe_seconds", 0.0))
        elif isinstance(e, ev.AgentError):
            errors.append(f"{e.title}: {e.message}")
            if e.fatal:
                fatal = f"{e.title}: {e.message}"
        elif isinstance(e, ev.FinalAnswer):
            final = e
    turn_log = [turns[k] for k in sorted(turns)]
    turn_model = sum((t["reasoning_seconds"] or 0.0) + (t["action_seconds"] or 0.0) + (t["observe_seconds"] or 0.0)
                     for t in turn_log)
    totals = dict(final.totals) if final else {}
    if "total" in totals and "tool" in totals:
        model_seconds = max(0.0, float(totals["total"]) - float(totals["tool"]))
    else:
        model_seconds = turn_model
    return {
        "prediction": final.answer if final else "",
        "turns": final.turns if final else len(turn_log),
        "stop_reason": final.stop_reason if final else "error",
        "totals": totals,
        "tools": dict(sorted(tools.items())),
        "searches": searches,
        "drafts": drafts,
        "turn_log": turn_log,
        "model_seconds": model_seconds,
        "turn_model_seconds": turn_model,
        "agent_errors": errors,
        "error": fatal if final is None else None,
    }


def make_record(q: Question, mode: ModeSpec, events: Iterable[ev.Event], *, wall_seconds: float | None = None,
                error: str | None = None) -> dict[str, Any]:
    """A result record for one (question, mode): what results.jsonl stores, one per line."""
    rec: dict[str, Any] = {"id": q.id, "mode": mode.name, "question": q.question, "answers": list(q.answers)}
    summary = summarize_events(events)
    if error is not None:
        summary["error"] = error
    exact, contains = match_answer(summary["prediction"], q.answers)
    rec.update(summary)
    rec.update(exact=exact, contains=contains, wall_seconds=wall_seconds)
    return rec


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "max": None}
    return {"n": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p95": percentile(values, 95), "max": max(values)}


def _share(num: int, den: int) -> float | None:
    return num / den if den else None


def mode_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate the records of one mode. Times in seconds; shares in 0..1 (None when undefined)."""
    n = len(records)
    turn_logs = [t for r in records for t in r["turn_log"]]
    reasoning = [t["reasoning_seconds"] for t in turn_logs if t["reasoning_seconds"] is not None]
    scored = [t for t in turn_logs if t["rationale"] is not None]
    consistent = [t for t in scored if t["action"] == t["rationale_action"]]
    mix = Counter(t["rationale"] for t in scored)
    mix_by_action = Counter(t["rationale_action"] for t in scored)
    tools: Counter[str] = Counter()
    for r in records:
        tools.update(r["tools"])
    actions = Counter(t["action"] for t in turn_logs if t["action"] is not None)
    status: Counter[str] = Counter(s["status"] for r in records for s in r["searches"])
    n_search = sum(v for k, v in status.items() if k != "unconfigured")
    hits = sum(status[s] for s in CACHE_HIT_STATUSES)
    covered = [r for r in records
               if r["error"] is None and all(s["status"] in OFFLINE_OK_STATUSES for s in r["searches"])]
    drafted = sum(r["drafts"]["drafted"] for r in records)
    accepted = sum(r["drafts"]["accepted"] for r in records)
    return {
        "questions": n,
        "errors": sum(1 for r in records if r["error"]),
        "success": {
            "exact": _share(sum(r["exact"] for r in records), n),
            "contains": _share(sum(r["contains"] for r in records), n),
            "exact_count": sum(r["exact"] for r in records),
            "contains_count": sum(r["contains"] for r in records),
        },
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in records).items())),
        "turns_per_question": distribution([r["turns"] for r in records]),
        "tool_calls": dict(sorted(tools.items())),
        "tool_calls_per_question": _share(sum(tools.values()), n),
        "actions": dict(sorted(actions.items())),
        "rationale_mix": {k: v / len(scored) for k, v in sorted(mix.items())},
        "rationale_mix_by_action": {k: v / len(scored) for k, v in sorted(mix_by_action.items())},
        "scored_turns": len(scored),
        "action_consistency": _share(len(consistent), len(scored)),
        "reasoning_seconds_per_turn": distribution(reasoning),
        "model_seconds_per_question": distribution([r["model_seconds"] for r in records]),
        "wall_seconds_per_question": distribution([r["wall_seconds"] for r in records if r.get("wall_seconds") is not None]),
        # total = searches that could have hit the cache (an unconfigured backend never touches it)
        "searches": {"total": n_search, **{s: status[s] for s in sorted(SEARCH_STATUSES | set(status))}},
        "cache_hits": hits,
        "cache_hit_rate": _share(hits, n_search),
        "offline_coverage": {
            "questions": len(covered),
            "share": _share(len(covered), n),
            "with_searches": sum(1 for r in covered if any(s["status"] in CACHE_HIT_STATUSES for s in r["searches"])),
        },
        "seprod": {"rounds": sum(r["drafts"]["rounds"] for r in records), "drafted": drafted, "accepted": accepted,
                   "acceptance": _share(accepted, drafted)},
    }


TIMING_KEYS = ("reasoning_seconds_per_turn", "model_seconds_per_question", "wall_seconds_per_question")


def compute_metrics(records: Iterable[dict[str, Any]], modes: Sequence[ModeSpec] | None = None) -> dict[str, dict[str, Any]]:
    """Metrics per mode name, in the order of ``modes`` (or first appearance)."""
    by_mode: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes or ()}
    for r in records:
        if modes is None or r["mode"] in by_mode:
            by_mode.setdefault(r["mode"], []).append(r)
    return {name: mode_metrics(recs) for name, recs in by_mode.items()}


# --------------------------------------------------------------------------------------------------
# The results file
# --------------------------------------------------------------------------------------------------


class ResultsStore:
    """``results.jsonl`` in ``out_dir``: one record per finished (question, mode), appended durably.

    A run killed mid-write leaves at most one partial last line; ``open`` cuts it off so the next
    append starts on a clean line. Records are keyed by (mode, id); the first one wins.
    """

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / RESULTS_FILE
        self.records: dict[tuple[str, str], dict[str, Any]] = {}

    def open(self, fingerprint: dict[str, Any] | None = None) -> ResultsStore:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._check_fingerprint(fingerprint)
        if not self.path.exists():
            return self
        data = self.path.read_bytes()
        good = 0  # byte offset after the last complete, valid line
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # a partial last line (killed mid-write)
            line = data[pos:nl]
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise EdgeAgentError(
                        f"{self.path} has a corrupt line at byte {pos}. Delete that line (or the file, to start over) and rerun.",
                        title="Bad results file",
                    ) from None
                self.records.setdefault((rec["mode"], rec["id"]), rec)
            pos = good = nl + 1
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return self

    def _check_fingerprint(self, fingerprint: dict[str, Any] | None) -> None:
        if fingerprint is None:
            return
        run = self.out_dir / RUN_FILE
        fp = json.loads(json.dumps(fingerprint))  # normalise (tuples -> lists, paths -> str)
        if run.exists():
            try:
                old = json.loads(run.read_text(encoding="utf-8")).get("fingerprint", {})
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                old = None
            if old is None:
                raise EdgeAgentError(f"{run} is not valid JSON. Delete {self.out_dir} (or use another --out) to start over.",
                                     title="Bad results folder")
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            if diff and self.path.exists() and self.path.stat().st_size:
                changes = "; ".join(f"{k}: {old.get(k)!r} -> {fp.get(k)!r}" for k in diff)
                raise ConfigError(
                    f"{self.out_dir} holds results made with other settings ({changes}). "
                    "Rerun with the same settings to resume, or pass another --out to start a new run."
                )
        tmp = run.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"fingerprint": fp}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, run)

    def has(self, mode: str, qid: str) -> bool:
        return (mode, qid) in self.records

    def append(self, record: dict[str, Any]) -> None:
        key = (record["mode"], record["id"])
        if key in self.records:
            raise ValueError(f"duplicate result for {key}")  # a bug in the caller, not a user error
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[key] = record


# --------------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------------


class EngineLike(Protocol):
    def ask(self, question: str, image: Any = None, *, cancel: threading.Event | None = None,
            mode: str | None = None, history: Any = None) -> Iterator[ev.Event]: ...


AskFn = Callable[[Any, ModeSpec, Question, "threading.Event | None"], Iterable[ev.Event]]


def default_ask(engine: Any, mode: ModeSpec, q: Question, cancel: threading.Event | None) -> Iterable[ev.Event]:
    """Run one question on the engine in ``mode``. SeProD is switched per call, models stay loaded."""
    image = str(q.image) if q.image is not None else None
    return engine.ask(q.question, image, cancel=cancel, mode=mode.engine_mode, seprod=mode.seprod)


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


# --------------------------------------------------------------------------------------------------
# Outputs: JSON, Markdown, PNG
# --------------------------------------------------------------------------------------------------


def write_outputs(run: EvalRun, *, plot: bool = True) -> dict[str, Path | None]:
    """Write results.json, report.md and (if matplotlib is installed) plot.png; returns their paths."""
    out = run.out_dir
    out.mkdir(parents=True, exist_ok=True)
    plot_path: Path | None = None
    plot_note = ""
    if plot:
        try:
            plot_path = write_plot(run, out / PLOT_FILE)
        except ImportError:
            plot_note = ("The plot was skipped: matplotlib is not installed. "
                         "Install the plot extra (`pip install 'edge-agent[plot]'`) and rerun the same command.")
    else:
        plot_note = "The plot was not requested."
    if plot_path is None and not plot_note:
        plot_note = "No plot: there are no timed turns yet."
    payload = {
        "dataset": str(run.dataset),
        "modes": [m.name for m in run.modes],
        "questions": len(run.questions),
        "fingerprint": run.fingerprint,
        "metrics": run.metrics,
        "records": run.records,
    }
    json_path = out / JSON_FILE
    _atomic_write(json_path, json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    report_path = out / REPORT_FILE
    _atomic_write(report_path, render_report(run, plot_path=plot_path, plot_note=plot_note))
    return {"json": json_path, "report": report_path, "plot": plot_path}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1000 * x:.0f} ms"


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _cell(text: Any, width: int = 60) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= width else s[: width - 1] + "…"


def _mode_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    s, r, t = m["success"], m["reasoning_seconds_per_turn"], m["model_seconds_per_question"]
    searches = m["searches"]
    oc = m["offline_coverage"]
    tools = ", ".join(f"{k} {v}" for k, v in m["tool_calls"].items()) or "none"
    other = "".join(f", {k} {searches[k]}" for k in ("unconfigured", "error") if searches.get(k))
    rows = [
        ("Questions", f"{m['questions']}" + (f" ({m['errors']} with errors)" if m["errors"] else "")),
        ("Success, exact match", f"{_pct(s['exact'])} ({s['exact_count']}/{m['questions']})"),
        ("Success, contains", f"{_pct(s['contains'])} ({s['contains_count']}/{m['questions']})"),
        ("Turns per question (mean / p95)", f"{_num(m['turns_per_question']['mean'])} / {_num(m['turns_per_question']['p95'])}"),
        ("Tool calls per question", _num(m["tool_calls_per_question"])),
        ("Tool calls", tools),
        ("Action-type consistency", f"{_pct(m['action_consistency'])} of {m['scored_turns']} scored turns"
         if m["scored_turns"] else "n/a (no scored rationales)"),
        ("Reasoning per turn (mean / p50 / p95)", f"{_ms(r['mean'])} / {_ms(r['p50'])} / {_ms(r['p95'])} ({r['n']} turns)"),
        ("Model time per question (mean / p50 / p95)", f"{_s(t['mean'])} / {_s(t['p50'])} / {_s(t['p95'])}"),
        ("Searches (live / cached / stale / offline miss)",
         f"{searches.get('live', 0)} / {searches.get('cached', 0)} / {searches.get('stale', 0)} / {searches.get('offline', 0)}{other}"),
        ("Cache hits", f"{m['cache_hits']} of {searches['total']} searches ({_pct(m['cache_hit_rate'])})"),
        ("Offline coverage (ran entirely from the cache)",
         f"{oc['questions']}/{m['questions']} questions ({_pct(oc['share'])}; {oc['with_searches']} of them used cached results)"),
        ("Stop reasons", ", ".join(f"{k} {v}" for k, v in m["stop_reasons"].items()) or "none"),
    ]
    if m["seprod"]["rounds"]:
        sp = m["seprod"]
        rows.append(("SeProD drafts accepted", f"{sp['accepted']}/{sp['drafted']} tokens ({_pct(sp['acceptance'])}) in {sp['rounds']} rounds"))
    return rows


def render_report(run: EvalRun, *, plot_path: Path | None = None, plot_note: str = "") -> str:
    """The Markdown report: a side-by-side summary, one table per mode, rationale mix, plot, per-question answers."""
    modes = [m.name for m in run.modes]
    M = run.metrics
    fp = run.fingerprint
    name = dataset_name(run.dataset)
    lines = [f"# Evaluation: {name} (`{run.dataset.name}`)", ""]
    lines.append(f"{len(run.questions)} questions x {len(modes)} modes ({', '.join(modes)}), "
                 f"{len(run.records)} results in `{RESULTS_FILE}`.")
    if fp:
        shown = {k: fp[k] for k in ("model", "mmproj", "prophet", "max_turns", "offline", "text_search", "seed") if k in fp}
        lines.append("Settings: " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ".")
    if len(modes) > 1:
        lines.append("For each question the modes run in this order on the same search cache, so a search an "
                     "earlier mode made live can be a cache hit for a later one.")
    missing = len(run.questions) * len(modes) - len(run.records)
    if missing:
        lines.append(f"**Incomplete:** {missing} (question, mode) pairs have no result yet; rerun the same command to finish.")
    lines += ["", "## Summary", ""]
    lines.append("| | " + " | ".join(modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    summary = [
        ("Success (exact)", lambda m: _pct(m["success"]["exact"])),
        ("Success (contains)", lambda m: _pct(m["success"]["contains"])),
        ("Turns per question", lambda m: _num(m["turns_per_question"]["mean"])),
        ("Reasoning per turn, mean", lambda m: _ms(m["reasoning_seconds_per_turn"]["mean"])),
        ("Reasoning per turn, p95", lambda m: _ms(m["reasoning_seconds_per_turn"]["p95"])),
        ("Model time per question, mean", lambda m: _s(m["model_seconds_per_question"]["mean"])),
        ("Action-type consistency", lambda m: _pct(m["action_consistency"])),
        ("Cache hits", lambda m: f"{m['cache_hits']}/{m['searches']['total']}"),
        ("Offline coverage", lambda m: f"{m['offline_coverage']['questions']}/{m['questions']}"),
    ]
    for label, fn in summary:
        lines.append(f"| {label} | " + " | ".join(fn(M[n]) for n in modes) + " |")
    base = M.get("freeform", {}).get("reasoning_seconds_per_turn", {}).get("mean")
    ratios = []
    for n in modes:
        r = M[n]["reasoning_seconds_per_turn"]["mean"]
        if n != "freeform" and base and r is not None:
            ratios.append(f"{n} {r / base:.2f}x ({100 * (1 - r / base):.0f}% less)")
    if ratios:
        lines += ["", "Mean reasoning time per turn vs freeform: " + "; ".join(ratios) + "."]

    for n in modes:
        lines += ["", f"## Mode: {n}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_cell(v, 200)} |" for k, v in _mode_rows(M[n])]

    ssr_modes = [n for n in modes if M[n]["scored_turns"]]
    if ssr_modes:
        ids = sorted({k for n in ssr_modes for k in M[n]["rationale_mix"]})
        lines += ["", f"## Rationale mix ({name})", "",
                  "Share of scored turns that chose each rationale.", ""]
        lines.append("| rationale | " + " | ".join(ssr_modes) + " |")
        lines.append("|---|" + "---|" * len(ssr_modes))
        for k in ids:
            lines.append(f"| {k} | " + " | ".join(_pct(M[n]["rationale_mix"].get(k, 0.0)) for n in ssr_modes) + " |")

    lines += ["", "## Plot", ""]
    if plot_path is not None:
        lines.append(f"![reasoning time per turn and rationale mix]({plot_path.name})")
    else:
        lines.append(plot_note)

    lines += ["", "## Answers", ""]
    lines.append("| id | question | answers | " + " | ".join(modes) + " |")
    lines.append("|---|---|---|" + "---|" * len(modes))
    recs = {(r["mode"], r["id"]): r for r in run.records}
    for q in run.questions:
        cells = []
        for n in modes:
            r = recs.get((n, q.id))
            if r is None:
                cells.append("(not run)")
                continue
            mark = "✓" if r["exact"] else ("≈" if r["contains"] else "✗")
            text = r["prediction"] if not r["error"] else f"error: {r['error']}"
            cells.append(f"{mark} {_cell(text, 40)}")
        lines.append(f"| {_cell(q.id, 30)} | {_cell(q.question, 50)} | {_cell(' / '.join(q.answers), 30)} | " + " | ".join(cells) + " |")
    lines += ["", "✓ exact match, ≈ contains an answer, ✗ neither (case, punctuation and articles ignored).", ""]
    return "\n".join(lines)


def write_plot(run: EvalRun, path: Path) -> Path | None:
    """Reasoning time per turn by mode (box plot, ms, log scale) and the rationale mix (stacked bars).

    Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend change).
    Raises ImportError when matplotlib is missing; returns None when there is nothing to plot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = [m.name for m in run.modes]
    times = {n: [1000 * t["reasoning_seconds"] for r in run.records if r["mode"] == n for t in r["turn_log"]
                 if t["reasoning_seconds"] is not None] for n in modes}
    if not any(times.values()):
        return None
    ssr_modes = [n for n in modes if run.metrics[n]["scored_turns"]]
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    shown = [n for n in modes if times[n]]
    ax.boxplot([times[n] for n in shown], showmeans=True)
    ax.set_xticks(range(1, len(shown) + 1), shown)
    if min(min(v) for v in times.values() if v) > 0:
        ax.set_yscale("log")
    ax.set_ylabel("reasoning time per turn (ms)")
    ax.set_title("Reasoning time per turn")
    ax.grid(axis="y", alpha=0.3)
    ax2 = fig.add_subplot(1, 2, 2)
    if ssr_modes:
        ids = sorted({k for n in ssr_modes for k in run.metrics[n]["rationale_mix"]})
        bottom = [0.0] * len(ssr_modes)
        for k in ids:
            vals = [100 * run.metrics[n]["rationale_mix"].get(k, 0.0) for n in ssr_modes]
            ax2.bar(ssr_modes, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax2.set_ylabel("share of scored turns (%)")
        ax2.set_ylim(0, 100)
        ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ax2.text(0.5, 0.5, "no SSR mode evaluated", ha="center", va="center")
        ax2.set_axis_off()
    ax2.set_title(f"Rationale mix ({dataset_name(run.dataset)})")
    fig.tight_layout()
    fig.savefig(path, format="png", bbox_inches="tight")  # keep the legend outside the axes
    return path
