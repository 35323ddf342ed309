#!/usr/bin/env python3
"""SSR's first turn on a text question, as shipped against as it was, side by side on the real 1.5B.

As shipped, a first turn whose scores could not change the move is not scored (the answer is checked
before a first search whatever SSR would choose, and the search is the only other move:
``AgentOptions.skip_unneeded_scoring``), and the answer check stops decoding once its threshold is out of
reach (``answer_check_early``). Before, turn 1 was scored and every check read all its tokens. Both give
the same moves and answers (tests/test_real_qwen.py compares the contexts); this measures what they save.

Each question of the dev split's Factbook and known sets (``--questions`` of each) is asked both ways in
one process, through the Factbook search service on 127.0.0.1, the order alternating per question (this
machine is shared and noisy: read the ratios). Free-form runs beside them, the same way, so the SSR / free-
form ratio of model seconds (the episode minus tool time) is measured in the same run. Reported: model
seconds per question of each, the ratios, turn 1's seconds (scoring, the rationale, the check, the action),
and whether every answer and move matched.

    .venv/bin/python scripts/bench_first_turn.py --questions 6 --json   # ~3 min

``--offline``: offline with nothing cached (no search service, no search offered): a text question's only
rationale is the answer's, and as shipped it is not scored (a softmax over one score is 1); "scored" scores
it as before.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

AGENT = "qwen2.5-coder-1.5b-instruct"
WAYS = ("shipped", "scored", "freeform")  # scored: turn 1 scored, every answer check read to its end


def ask(engine: Any, question: str, options: Any) -> dict[str, Any]:
    from edge_agent.engine.face import AskRequest

    t0 = time.perf_counter()
    events = list(engine.ask(AskRequest(question, None, options=options)))
    final = events[-1]
    if final.kind != "final_answer":
        raise SystemExit(f"{question!r}: no answer ({final})")
    totals = final.totals
    turn1 = [e for e in events if e.kind == "turn_finished" and e.turn == 1]
    first = turn1[0].reasoning_seconds + turn1[0].action_seconds if turn1 else 0.0
    return {"answer": final.answer, "turns": final.turns, "wall": time.perf_counter() - t0,
            "model": totals["total"] - totals["tool"], "turn1": first,
            "moves": [(e.kind, getattr(e, "action", None)) for e in events
                      if e.kind in ("turn_finished", "move_withdrawn", "tool_called")],
            "checks": [(e.sure, e.early, len(e.pieces)) for e in events if e.kind == "answer_checked"]}


def _same(row: dict[str, Any]) -> bool:
    """The shipped first turn and the one scored with every check read to its end: the same answer, moves
    and answer-check verdicts."""
    a, b = row["shipped"], row["scored"]
    return (a["answer"] == b["answer"] and a["moves"] == b["moves"]
            and [c[0] for c in a["checks"]] == [c[0] for c in b["checks"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=12, help="questions of each set (Factbook, known)")
    ap.add_argument("--model", default=AGENT)
    ap.add_argument("--offline", action="store_true",
                    help="offline with nothing cached: no search offered, the answer the only move")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from edge_agent.agent.options import AgentOptions
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine
    from scripts.eval_quality import check_models, question_sets
    from scripts.factbook import build_index, load_countries, start_server

    check_models([args.model])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-first-turn-") as tmp:
        with contextlib.redirect_stdout(sys.stderr):  # the question sets' table: stdout is the result's
            sets = question_sets(Path(tmp), "dev")
        questions = [json.loads(line)["question"]
                     for name in ("factbook", "known")
                     for line in sets[name].read_text(encoding="utf-8").splitlines()[: args.questions]]
        server = None if args.offline else start_server(build_index(load_countries()))
        try:
            search = ({"offline": True} if server is None
                      else {"text_search": "searxng", "searxng_url": server.url})
            settings = Settings.load({"model": args.model, **search}, env={"EDGE_AGENT_HOME": tmp})
            with Engine.from_settings(settings) as engine:
                ssr = AgentOptions.from_settings(settings, mode="ssr", library=engine.library)
                options = {"shipped": ssr,
                           "scored": dataclasses.replace(ssr, skip_unneeded_scoring=False,
                                                         answer_check_early=False),
                           "freeform": AgentOptions.from_settings(settings, mode="freeform",
                                                                  library=engine.library)}
                ask(engine, "What is 2+2?", ssr)  # warm: the system prompt, the neutral scores
                rows = []
                for i, q in enumerate(questions):
                    order = WAYS if i % 2 == 0 else tuple(reversed(WAYS))
                    got = {way: ask(engine, q, options[way]) for way in order}
                    rows.append({"question": q, **got})
                    print(f"{i + 1}/{len(questions)} {q}: shipped {got['shipped']['model']:.2f} s, scored "
                          f"{got['scored']['model']:.2f} s, free-form {got['freeform']['model']:.2f} s",
                          file=sys.stderr)
        finally:
            if server is not None:
                server.stop()

    def mean(way: str, key: str) -> float:
        return statistics.fmean(r[way][key] for r in rows)

    same = [_same(r) for r in rows]
    for r, ok in zip(rows, same, strict=True):
        if not ok:
            print(f"differs: {r['question']}: shipped {r['shipped']['answer']!r} {r['shipped']['moves']} "
                  f"{r['shipped']['checks']}; scored {r['scored']['answer']!r} {r['scored']['moves']} "
                  f"{r['scored']['checks']}", file=sys.stderr)
    out = {
        "model": args.model, "questions": len(rows), "offline": args.offline,
        "model_seconds": {way: mean(way, "model") for way in WAYS},
        "turn1_seconds": {way: mean(way, "turn1") for way in WAYS},
        "shipped_over_scored": mean("shipped", "model") / mean("scored", "model"),
        "shipped_over_freeform": mean("shipped", "model") / mean("freeform", "model"),
        "scored_over_freeform": mean("scored", "model") / mean("freeform", "model"),
        "turn1_saved_s": mean("scored", "turn1") - mean("shipped", "turn1"),
        "check_tokens": {way: sum(c[2] for r in rows for c in r[way]["checks"])
                         for way in ("shipped", "scored")},
        "checks_stopped_early": sum(c[1] for r in rows for c in r["shipped"]["checks"]),
        "same_answers_and_moves": sum(same),
        "seconds": time.perf_counter() - t0,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        ms, t1 = out["model_seconds"], out["turn1_seconds"]
        print(f"{len(rows)} questions ({args.model}); model seconds per question: shipped "
              f"{ms['shipped']:.2f}, scored {ms['scored']:.2f}, free-form {ms['freeform']:.2f}")
        print(f"shipped / scored {out['shipped_over_scored']:.3f}; shipped / free-form "
              f"{out['shipped_over_freeform']:.3f} (scored / free-form {out['scored_over_freeform']:.3f})")
        print(f"turn 1: shipped {t1['shipped']:.2f} s, scored {t1['scored']:.2f} s; answer-check tokens "
              f"{out['check_tokens']['shipped']} vs {out['check_tokens']['scored']} "
              f"({out['checks_stopped_early']} checks stopped early)")
        print(f"same answers and moves: {out['same_answers_and_moves']} of {len(rows)}")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
