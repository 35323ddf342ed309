"""The outputs of a run: ``results.json`` (records + metrics), the Markdown ``report.md``, and the plot.

Knows: the metrics' fields and how to lay them out. Does not know: how they were computed or run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_agent.core.files import atomic_write
from edge_agent.evaluation.dataset import dataset_name
from edge_agent.evaluation.plot import write_plot
from edge_agent.evaluation.runner import EvalRun
from edge_agent.evaluation.store import RESULTS_FILE

JSON_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "plot.png"


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
                         "Install the plot extra (`pip install 'edge-agent[plot]'`) and rerun the same "
                         "command.")
    else:
        plot_note = "The plot was not requested."
    if plot_path is None and not plot_note:
        plot_note = "No plot: there are no timed turns yet."
    payload = {
        "dataset": str(run.dataset),
        "modes": [m.name for m in run.modes],
        "questions": len(run.questions),
        "fingerprint": run.fingerprint,
        "model_files": run.model_files,
        "cluster": run.cluster,
        "metrics": run.metrics,
        "records": run.records,
    }
    json_path = out / JSON_FILE
    atomic_write(json_path, json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    report_path = out / REPORT_FILE
    atomic_write(report_path, render_report(run, plot_path=plot_path, plot_note=plot_note))
    return {"json": json_path, "report": report_path, "plot": plot_path}



def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1000 * x:.0f} ms"


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ci(ci: Any) -> str:
    return "" if not ci else f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}%]"


def _agreement(m: dict[str, Any]) -> str:
    a = m.get("reasoning_action_agreement") or {}
    if not a.get("turns"):
        return "n/a"
    return f"{_pct(a['share'])} of {a['with_plan']} turns stating a next step ({a['turns']} written)"


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
        ("Success, exact match (95% CI)",
         f"{_pct(s['exact'])} ({s['exact_count']}/{m['questions']}){_ci(s.get('exact_ci95'))}"),
        ("Success, contains (95% CI)",
         f"{_pct(s['contains'])} ({s['contains_count']}/{m['questions']}){_ci(s.get('contains_ci95'))}"),
        ("Turns per question (mean / p95)",
         f"{_num(m['turns_per_question']['mean'])} / {_num(m['turns_per_question']['p95'])}"),
        ("Tool calls per question", _num(m["tool_calls_per_question"])),
        ("Searches / repeated identical searches per question",
         f"{_num(m.get('searches_per_question'))} / {_num(m.get('repeated_searches_per_question'))}"),
        ("Moves taken back (nothing new) per question", _num(m.get("withdrawn_moves_per_question"))),
        ("Reasoning/action type agreement (free-form)", _agreement(m)),
        ("Tool calls", tools),
        ("Action-type consistency", f"{_pct(m['action_consistency'])} of {m['scored_turns']} scored turns"
         if m["scored_turns"] else "n/a (no scored rationales)"),
        ("Reasoning per turn (mean / p50 / p95)",
         f"{_ms(r['mean'])} / {_ms(r['p50'])} / {_ms(r['p95'])} ({r['n']} turns)"),
        ("Model time per question (mean / p50 / p95)", f"{_s(t['mean'])} / {_s(t['p50'])} / {_s(t['p95'])}"),
        ("Searches (live / cached / stale / offline miss)",
         f"{searches.get('live', 0)} / {searches.get('cached', 0)} / {searches.get('stale', 0)} / "
         f"{searches.get('offline', 0)}{other}"),
        ("Cache hits", f"{m['cache_hits']} of {searches['total']} searches ({_pct(m['cache_hit_rate'])})"),
        ("Offline coverage (searches all answered by the cache)",
         f"{oc['questions']}/{oc['searched']} questions that searched ({_pct(oc['share'])}); "
         f"{oc['without_search']} did not search"),
        ("Stop reasons", ", ".join(f"{k} {v}" for k, v in m["stop_reasons"].items()) or "none"),
    ]
    sp = m["seprod"]
    skipped = sp.get("skipped", {})
    if sp["rounds"] or skipped:
        reasons = ", ".join(f"{k} {v}" for k, v in skipped.items())
        why = f"; {sum(skipped.values())} rounds used no draft ({reasons})" if skipped else ""
        rows.append(("SeProD drafts accepted",
                     f"{sp['accepted']}/{sp['drafted']} tokens ({_pct(sp['acceptance'])}) in {sp['rounds']} "
                     f"rounds{why}"))
    return rows


def cluster_line(c: dict[str, Any]) -> str:
    """``Ran on Ray (local): 2 workers x 1 thread on 1 node (host (ip)); per worker: w1 5, w2 3 (1
    restart).``"""
    nodes = c.get("nodes") or []
    per = ", ".join(f"w{k} {w['done']}" + (f" ({w['restarts']} restarted)" if w["restarts"] else "")
                    for k, w in enumerate(c.get("per_worker") or [], 1))
    gpus = f" + {c['gpus_per_worker']:g} GPU" if c.get("gpus_per_worker") else ""
    return (f"Ran on Ray ({c.get('address')}): {c.get('workers')} workers x {c.get('threads_per_worker')} "
            f"thread(s){gpus} on {len(nodes)} node(s) ({', '.join(nodes)})" + (f"; results per worker this "
            f"run: {per}." if per else "."))


def render_report(run: EvalRun, *, plot_path: Path | None = None, plot_note: str = "") -> str:
    """The Markdown report: a side-by-side summary, one table per mode, rationale mix, plot, per-question
    answers."""
    modes = [m.name for m in run.modes]
    M = run.metrics
    name = dataset_name(run.dataset)
    lines = _header(run, modes, name)
    lines += ["", "## Summary", ""]
    lines.append("| | " + " | ".join(modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    summary = [
        ("Success (exact), 95% CI",
         lambda m: _pct(m["success"]["exact"]) + _ci(m["success"].get("exact_ci95"))),
        ("Success (contains), 95% CI",
         lambda m: _pct(m["success"]["contains"]) + _ci(m["success"].get("contains_ci95"))),
        ("Turns per question", lambda m: _num(m["turns_per_question"]["mean"])),
        ("Searches per question", lambda m: _num(m.get("searches_per_question"))),
        ("Repeated identical searches per question", lambda m: _num(m.get("repeated_searches_per_question"))),
        ("Reasoning per turn, mean", lambda m: _ms(m["reasoning_seconds_per_turn"]["mean"])),
        ("Reasoning per turn, p95", lambda m: _ms(m["reasoning_seconds_per_turn"]["p95"])),
        ("Model time per question, mean", lambda m: _s(m["model_seconds_per_question"]["mean"])),
        ("Action-type consistency (SSR)", lambda m: _pct(m["action_consistency"])),
        ("Reasoning/action agreement (free-form)",
         lambda m: _pct((m.get("reasoning_action_agreement") or {}).get("share"))),
        ("SeProD acceptance", lambda m: _pct(m["seprod"]["acceptance"])),
        ("Cache hits", lambda m: f"{m['cache_hits']}/{m['searches']['total']}"),
        ("Offline coverage",
         lambda m: f"{m['offline_coverage']['questions']}/{m['offline_coverage']['searched']}"),
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
            lines.append(f"| {k} | " + " | ".join(_pct(M[n]["rationale_mix"].get(k,
                                                                                 0.0))
                                                  for n in ssr_modes) + " |")

    lines += ["", "## Plot", ""]
    if plot_path is not None:
        lines.append(f"![reasoning time per turn and rationale mix]({plot_path.name})")
    else:
        lines.append(plot_note)

    lines += _answers(run, modes)
    lines += ["", "✓ exact match, ≈ contains an answer, ✗ neither (case, punctuation and articles ignored).",
              ""]
    return "\n".join(lines)


def _header(run: EvalRun, modes: list[str], name: str) -> list[str]:
    """The report's title and what ran: questions, modes, settings, model files, cluster, gaps."""
    fp = run.fingerprint
    lines = [f"# Evaluation: {name} (`{run.dataset.name}`)", ""]
    lines.append(f"{len(run.questions)} questions x {len(modes)} modes ({', '.join(modes)}), "
                 f"{len(run.records)} results in `{RESULTS_FILE}`.")
    if fp:
        shown = {k: fp[k] for k in ("model", "mmproj", "prophet", "max_turns", "offline", "text_search",
                                    "seed") if k in fp}
        lines.append("Settings: " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ".")
    if run.model_files:
        order = ("model", "mmproj", "prophet", "prophet_mmproj")
        files = sorted(run.model_files.items(),
                       key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        lines.append("Model files: " + ", ".join(f"{k} `{v}`" for k, v in files) + ".")
    if run.cluster:
        lines.append(cluster_line(run.cluster))
    if len(modes) > 1:
        lines.append("For each question the modes run in this order on the same search cache, so a search an "
                     "earlier mode made live can be a cache hit for a later one.")
    missing = len(run.questions) * len(modes) - len(run.records)
    if missing:
        lines.append(f"**Incomplete:** {missing} (question, mode) pairs have no result yet; rerun the same "
                     f"command to finish.")
    return lines


def _answers(run: EvalRun, modes: list[str]) -> list[str]:
    """The per-question table: each mode's answer, marked exact / contains / neither."""
    lines: list[str] = []
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
        lines.append(f"| {_cell(q.id, 30)} | {_cell(q.question, 50)} | {_cell(' / '.join(q.answers), 30)} "
                     "| " + " | ".join(cells) + " |")
    return lines

