#!/usr/bin/env python3
"""Benchmark text that waits for the next decode (``append_text(defer=True)``) against evaluating every
append at once, side by side, on a real Qwen model answering Factbook questions through a search service on
127.0.0.1.

Usage:
    python scripts/bench_defer.py [--model qwen2.5-coder-1.5b-instruct] [--questions 12] [--known 4]
                                  [--modes ssr,freeform] [--split dev] [--json]

What waits: a search's observation (the action's closing ``}}\\n</tool_call>``, the ``<tool_response>``
wrapper, the untrusted results, the next think block: four decodes before, one now), a rationale pasted
again after a move was taken back (with the think close and the action's head), free-form's think close
(with the action), an image's wrapper tokens (with the text around them). On a 2-core CPU small decodes
are slow per token (Qwen 1.5B: 9 tokens alone 300 ms, ~15 ms a token in a 247-token decode).

Each question runs in both variants back to back through one Engine (the order alternates per question;
``Session.defer_appends`` switches it; the search cache and the system prompt's state are warmed first, so
both variants read the same cached results). Reported per mode: model seconds per question (the episode
minus tool time) in each variant, the ratio of the means and the median per-question ratio (``defer /
eager``), llama_decode calls per question, and how many answers came out the same: the tokens are the
same, but a decode of other size takes other quantized kernels in llama.cpp, so a greedy choice at a
near-tie can differ (``tests/test_forced_text.py::batching_gap``). Times are wall-clock on a shared
machine: read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="an installed model's name")
    ap.add_argument("--split", choices=["dev", "test"], default="dev")
    ap.add_argument("--questions", type=int, default=12, help="the split's first N Factbook questions")
    ap.add_argument("--known", type=int, default=4, help="the split's first N known questions")
    ap.add_argument("--modes", default="ssr,freeform")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    on = [r["defer_s"] for r in rows]
    off = [r["eager_s"] for r in rows]
    return {
        "questions": len(rows),
        "defer_s": round(statistics.fmean(on), 3), "eager_s": round(statistics.fmean(off), 3),
        "defer_over_eager": round(statistics.fmean(on) / statistics.fmean(off), 3),
        "median_question_ratio": round(statistics.median(a / b for a, b in zip(on, off, strict=True)), 3),
        "decodes_defer": round(statistics.fmean(r["defer_decodes"] for r in rows), 1),
        "decodes_eager": round(statistics.fmean(r["eager_decodes"] for r in rows), 1),
        "same_answer": sum(r["same_answer"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from edge_agent.agent import events as ev
    from edge_agent.commands.eval import engine_factory
    from edge_agent.core.config import Settings
    from edge_agent.evaluation import load_dataset, parse_modes
    from edge_agent.evaluation.runner import default_ask
    from edge_agent.runtime.session import Session
    from scripts.eval_quality import check_models, question_sets
    from scripts.factbook import build_index, load_countries, start_server

    check_models([args.model])
    tmp = Path(tempfile.mkdtemp(prefix="bench-defer-"))
    with contextlib.redirect_stdout(sys.stderr):  # the question sets' summary is not this benchmark's output
        sets = question_sets(tmp, args.split)
    questions = load_dataset(sets["factbook"], limit=args.questions) + (
        load_dataset(sets["known"], limit=args.known) if args.known else [])
    modes = parse_modes(args.modes)
    server = start_server(build_index(load_countries()))
    rows: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes}
    engine = None
    try:
        settings = Settings.load({"model": args.model, "text_search": "searxng", "searxng_url": server.url},
                                 env={"EDGE_AGENT_HOME": str(tmp / "home")})
        engine = engine_factory(settings)()
        handle = engine.model.handle

        def run(mode: Any, q: Any, defer: bool) -> tuple[float, int, str]:
            Session.defer_appends = defer
            d0 = handle.decodes
            final = None
            for e in default_ask(engine, mode, q, None):
                if isinstance(e, ev.FinalAnswer):
                    final = e
            if final is None:
                raise SystemExit(f"{q.id} ({mode.name}) ended without an answer.")
            return final.totals["total"] - final.totals["tool"], handle.decodes - d0, final.answer

        for mode in modes:  # untimed: the search cache and the system prompt's state, for both variants
            run(mode, questions[0], True)
        for i, q in enumerate(questions):
            for mode in modes:
                order = (True, False) if i % 2 == 0 else (False, True)
                got = {d: run(mode, q, d) for d in order}
                rows[mode.name].append({"id": q.id, "defer_s": got[True][0], "eager_s": got[False][0],
                                        "defer_decodes": got[True][1], "eager_decodes": got[False][1],
                                        "same_answer": got[True][2] == got[False][2]})
                print(f"{q.id:28s} {mode.name:9s} defer {got[True][0]:6.2f} s ({got[True][1]} decodes)  "
                      f"eager {got[False][0]:6.2f} s ({got[False][1]})", file=sys.stderr, flush=True)
    finally:
        Session.defer_appends = True
        if engine is not None:
            engine.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the question sets and the home: nothing left in the temp dir
    result = {"model": args.model, "split": args.split,
              "modes": {name: summary(rs) for name, rs in rows.items() if rs}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, s in result["modes"].items():
            print(f"{name}: {s['questions']} questions, model s/question defer {s['defer_s']} vs eager "
                  f"{s['eager_s']} ({s['defer_over_eager']}x; median per question "
                  f"{s['median_question_ratio']}x), decodes {s['decodes_defer']} vs {s['decodes_eager']}, "
                  f"same answer {s['same_answer']}/{s['questions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
