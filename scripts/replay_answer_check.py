#!/usr/bin/env python3
"""Replay SSR's answer check at other thresholds from two eval runs, without running the model again.

PASS: a run where every check passed (``--set ssr_answer_check=-19.9``: each question answered from what
the model knows, its check's tokens and log-probs recorded); FAIL: a run where every check failed
(``--set ssr_answer_check=0``: each question searched first). At a threshold, a question whose check (its
score by today's ``answer_check.answer_score``, from PASS's tokens) reaches it takes PASS's record, else
FAIL's; a question with no check (a sum, a tool result first) takes PASS's. Prints, per set and threshold,
answers right (contains) and turns per question. What it cannot see: a probe that would have read on (or
stopped) elsewhere under another scoring; confirm a choice with a real run.

``--grounding``: a what-if for the answers after a search. Such an answer whose words that add to the
question appear in none of the results its searches returned (searched again on the Factbook index: the
service is deterministic) did not come from them; it prints those answers beside the one the model gave
from what it knows (PASS's), and the counts if such answers were taken from PASS instead.

    .venv/bin/python scripts/replay_answer_check.py runs/dev-pass runs/dev-fail --thresholds=-0.2,-0.225,-0.25
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETS = ("factbook", "known", "followup")


def records(run: Path, mode: str = "ssr") -> dict[tuple[str, str], dict[str, Any]]:
    """(set, question id) -> the mode's record, from each set's main results."""
    out = {}
    for name in SETS:
        path = run / f"{name}-main" / "results.jsonl"
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                r = json.loads(line)
                if r["mode"] == mode:
                    out[(name, r["id"])] = r
    return out


def replayed(key: tuple[str, str], rec: dict, failed: dict, threshold: float) -> tuple[dict, bool]:
    """The record a question takes at ``threshold`` (``rec``, its PASS record, or its FAIL one when its check
    scores below), and whether it scored below."""
    from edge_agent.agent.answer_check import answer_score

    if not rec["answer_checks"]:
        return rec, False
    check = rec["answer_checks"][0]
    if answer_score(check["pieces"], check["logprobs"], rec["question"]) >= threshold:
        return rec, False
    if key not in failed:
        raise SystemExit(f"{key[1]} ({key[0]}) is not in the FAIL run: run it on the same questions.")
    return failed[key], True


def replay(passed: dict, failed: dict, threshold: float) -> dict[str, dict[str, float]]:
    """Per set: questions, right (contains), turns per question, searched first (checks below)."""
    sums: dict[str, list[float]] = {}
    for key, rec in passed.items():
        chosen, below = replayed(key, rec, failed, threshold)
        s = sums.setdefault(key[0], [0, 0, 0, 0])
        s[0] += 1
        s[1] += bool(chosen["contains"])
        s[2] += chosen["turns"]
        s[3] += below
    return {name: {"questions": n, "right": right, "turns": turns / n, "searched_first": below}
            for name, (n, right, turns, below) in sums.items()}


def grounded(answer: str, question: str, results: str) -> bool:
    """Whether a word of ``answer`` that adds to ``question`` (``answer_check.question_words``) is in
    ``results`` (case-folded text), or no word adds."""
    from edge_agent.agent.answer_check import _WORD, question_words

    asked = question_words(question)
    words = [w.casefold() for w in _WORD.findall(answer) if w.casefold() not in asked]
    return not words or any(w in results.casefold() for w in words)


def grounding(passed: dict, failed: dict, threshold: float, results: Callable[[str], str]
              ) -> dict[str, dict[str, Any]]:
    """Per set, at ``threshold``: right as replayed, and right if each answer after a search that is not
    :func:`grounded` in its searches' ``results(query)`` were the one from what the model knows."""
    out: dict[str, dict[str, Any]] = {}
    for key, rec in passed.items():
        s = out.setdefault(key[0], {"questions": 0, "right": 0, "right_if_grounded": 0, "not_grounded": []})
        s["questions"] += 1
        searched, below = replayed(key, rec, failed, threshold)
        if not below:
            s["right"] += bool(rec["contains"])
            s["right_if_grounded"] += bool(rec["contains"])
            continue
        s["right"] += bool(searched["contains"])
        text = " ".join(results(q["query"]) for q in searched["searches"] if q.get("query"))
        if grounded(searched["prediction"], searched["question"], text):
            s["right_if_grounded"] += bool(searched["contains"])
        else:
            s["right_if_grounded"] += bool(rec["contains"])
            s["not_grounded"].append({"id": key[1], "after_search": searched["prediction"],
                                      "right": bool(searched["contains"]),
                                      "from_knowledge": rec["prediction"],
                                      "knowledge_right": bool(rec["contains"])})
    return out


def factbook_results() -> Callable[[str], str]:
    """The text (titles and contents) the Factbook service returns for a query."""
    from scripts.factbook import build_index, load_countries, searxng_response

    index = build_index(load_countries())

    def results(query: str) -> str:
        return " ".join(f"{r['title']} {r['content']}" for r in searxng_response(query, index.search(query))
                        ["results"])
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("passed", type=Path, help="the run where every check passed")
    ap.add_argument("failed", type=Path, help="the run where every check failed")
    ap.add_argument("--thresholds", default="-0.15,-0.2,-0.225,-0.25,-0.3,-0.35,-0.4",
                    help="comma-separated; write --thresholds=-0.2,-0.3 (a list starting with - is no value)")
    ap.add_argument("--grounding", type=float, metavar="THRESHOLD", default=None,
                    help="the what-if for answers after a search not grounded in their results, at THRESHOLD")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    passed, failed = records(args.passed), records(args.failed)
    if not passed:
        raise SystemExit(f"No SSR records in {args.passed} (its <set>-main/results.jsonl).")
    if args.grounding is not None:
        what_if = grounding(passed, failed, args.grounding, factbook_results())
        print(json.dumps(what_if, indent=2, ensure_ascii=False))
        return 0
    table = {t: replay(passed, failed, float(t)) for t in args.thresholds.split(",")}
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    names = [n for n in SETS if any(n in row for row in table.values())]
    print("| threshold | " + " | ".join(f"{n} right, turns" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for t, row in table.items():
        print(f"| {t} | " + " | ".join(f"{row[n]['right']}/{row[n]['questions']}, {row[n]['turns']:.2f}"
                                        for n in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
