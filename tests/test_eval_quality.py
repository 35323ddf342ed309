"""The quality eval's pieces that need no model: a question's events fold into searches (with their
queries), moves taken back and free-form agreement; the combined table shows success with its 95%
interval. The runs themselves are `scripts/eval_quality.py` on the real 1.5B (README)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from edge_agent import evaluation as E
from edge_agent.agent import events as ev
from scripts.eval_quality import (
    CHECK,
    checks,
    chosen_sets,
    followups,
    markdown,
    mean_interval,
    row,
    table_rows,
    time_ratio,
)


def _episode(queries: list[str], answer: str, *, reasoning: str = "", withdrawn: int = 0) -> list[ev.Event]:
    out: list[ev.Event] = []
    for t, q in enumerate(queries, 1):
        if reasoning:
            out.append(ev.ReasoningDone(turn=t, text=reasoning, n_tokens=5, seconds=0.1))
        out.append(ev.ToolCalled(turn=t, name="text_search", arguments={"query": q}, action_seconds=0.1))
        out.append(ev.ToolFinished(turn=t, name="text_search", ok=True, observation="1. x: y", seconds=0.01))
        out.append(ev.TurnFinished(turn=t, action="text_search", reasoning_seconds=0.1, action_seconds=0.1,
                                   tool_seconds=0.01))
    out += [ev.MoveWithdrawn(turn=len(queries) + 1, action="text_search", arguments={"query": q},
                             reason="already searched") for q in queries[-1:]] * withdrawn
    out.append(ev.FinalAnswer(answer=answer, turns=len(queries) + 1, stop_reason="answered"))
    return out


def test_records_count_repeats_withdrawn_moves_and_agreement():
    q = E.Question("fb-pe-capital", "What is the capital of Peru?", ("Lima",), None)
    recs = [E.make_record(q, E.MODES["freeform"], _episode(["capital of Peru", "Capital of  peru"], "Lima",
                                                           reasoning="I will search for it.")),
            E.make_record(q, E.MODES["freeform"], _episode(["capital of Peru"], "Cusco", withdrawn=1,
                                                           reasoning="The answer is Lima."))]
    m = E.mode_metrics(recs)
    assert m["searches_per_question"] == 1.5 and m["repeated_searches_per_question"] == 0.5
    assert m["withdrawn_moves_per_question"] == 0.5
    assert m["success"]["contains_count"] == 1 and m["success"]["contains_ci95"] == E.wilson(1, 2)
    # "I will search" then a search: agree (2 turns); "The answer is Lima." then a search: disagree
    assert m["reasoning_action_agreement"] == {"turns": 3, "with_plan": 3, "agree": 2, "share": 2 / 3}


def test_the_combined_table_shows_intervals():
    q = E.Question("k", "What is 17*23?", ("391",), None)
    recs = [E.make_record(q, E.MODES["ssr"], _episode([], "391"))] * 3
    rows = {"known": [row("ssr", E.mode_metrics(recs))]}
    md = markdown(rows, argparse.Namespace(model="m", split="dev", ablations=5, checks=4))
    line = next(x for x in md.splitlines() if x.startswith("| known | ssr |"))
    lo = round(100 * E.wilson(3, 3)[0])
    assert f"| 100% [{lo}-100] |" in line and "| 3 |" in line
    lines = md.splitlines()
    header = lines.index(next(x for x in lines if x.startswith("| set |")))
    assert lines[header + 1].count("---") == 11


def test_ablations_are_shown_beside_ssr_on_their_own_questions():
    qs = [E.Question(f"q{i}", "What is 17*23?", ("391",), None) for i in range(4)]
    main_recs = [E.make_record(q, E.MODES["ssr"], _episode([], "391" if i < 2 else "no"))
                 for i, q in enumerate(qs)]
    main = argparse.Namespace(questions=qs, records=main_recs, metrics={"ssr": E.mode_metrics(main_recs)})
    abl_recs = [E.make_record(q, E.MODES["ssr-index"], _episode([], "no")) for q in qs[:2]]
    ablation = argparse.Namespace(questions=qs[:2], records=abl_recs,
                                  metrics={"ssr-index": E.mode_metrics(abl_recs)})
    rows = table_rows([main, ablation])
    assert [r["mode"] for r in rows] == ["ssr", "ssr, same 2", "ssr-index"]
    # all four questions, then the first two only (both right), then the ablation on those two
    assert [r["contains"] for r in rows] == [0.5, 1.0, 0.0] and [r["questions"] for r in rows] == [4, 2, 2]


def test_the_followup_set_is_the_known_set_after_factbook_questions(tmp_path):
    """Known question i follows Factbook question i (cycling); the file is rewritten only when it differs,
    and it loads as follow-ups."""
    fb, known = tmp_path / "dev.jsonl", tmp_path / "known-dev.jsonl"
    fb.write_text("".join(json.dumps({"id": f"fb{i}", "image": None, "question": f"Factbook {i}?",
                                      "answers": ["x"]}) + "\n" for i in range(2)), encoding="utf-8")
    known.write_text("".join(json.dumps({"id": f"k{i}", "image": None, "question": f"Known {i}?",
                                         "answers": [str(i)]}) + "\n" for i in range(3)), encoding="utf-8")
    path = followups(fb, known, tmp_path / "followup-dev.jsonl")
    qs = E.load_dataset(path)
    assert [(q.id, q.question, q.follows, q.answers) for q in qs] == [
        ("followup-k0", "Known 0?", "Factbook 0?", ("0",)),
        ("followup-k1", "Known 1?", "Factbook 1?", ("1",)),
        ("followup-k2", "Known 2?", "Factbook 0?", ("2",))]
    mtime = path.stat().st_mtime_ns
    assert followups(fb, known, path) == path and path.stat().st_mtime_ns == mtime


def test_the_check_set_asks_to_check_each_factbook_answer(tmp_path):
    """"Are you sure? Please check." follows Factbook question i, scored against its answers; it loads as
    follow-ups, and the agent reads it as a request to search."""
    from edge_agent.agent.intent import asks_to_search

    fb = tmp_path / "dev.jsonl"
    fb.write_text("".join(json.dumps({"id": f"fb{i}", "image": None, "question": f"Factbook {i}?",
                                      "answers": [f"a{i}"]}) + "\n" for i in range(2)), encoding="utf-8")
    qs = E.load_dataset(checks(fb, tmp_path / "check-dev.jsonl"))
    assert [(q.id, q.question, q.follows, q.answers) for q in qs] == [
        ("check-fb0", CHECK, "Factbook 0?", ("a0",)), ("check-fb1", CHECK, "Factbook 1?", ("a1",))]
    assert asks_to_search(CHECK, {"text_search", "answer"}) == "text_search"


def test_ssr_time_over_free_form_is_paired_by_question_with_an_interval():
    """SSR's model seconds over free-form's: the ratio of the sums on the questions both answered, with a
    seeded paired-bootstrap 95% interval around it (wider with fewer questions); the table says it."""
    recs = [{"id": f"q{i}", "mode": mode, "model_seconds": s}
            for i in range(40) for mode, s in (("ssr", 2.0 + (i % 5)), ("freeform", 5.0 + (i % 3)))]
    recs.append({"id": "only-ssr", "mode": "ssr", "model_seconds": 100.0})  # no pair: left out
    ratio, (lo, hi) = time_ratio(recs)
    assert ratio == sum(2.0 + i % 5 for i in range(40)) / sum(5.0 + i % 3 for i in range(40))
    assert lo < ratio < hi and time_ratio(recs) == (ratio, (lo, hi))
    _, (lo8, hi8) = time_ratio([r for r in recs if r["id"] in {f"q{i}" for i in range(8)}])
    assert hi8 - lo8 > hi - lo
    assert time_ratio([r for r in recs if r["mode"] == "ssr"]) is None
    q = E.Question("k", "What is 17*23?", ("391",), None)
    main_recs = [{**E.make_record(q, E.MODES[m], _episode([], "391")), "model_seconds": t}
                 for m, t in (("ssr", 1.0), ("freeform", 4.0))]
    main = argparse.Namespace(questions=[q], records=main_recs,
                              metrics={m: E.mode_metrics([r for r in main_recs if r["mode"] == m])
                                       for m in ("freeform", "ssr")})
    rows = {"known": table_rows([main])}
    ssr = next(r for r in rows["known"] if r["mode"] == "ssr")
    assert ssr["model_seconds_over_freeform"] == 0.25
    args = argparse.Namespace(model="m", split="dev", ablations=0, checks=0)
    assert "SSR's model seconds over free-form's" in markdown(rows, args)


def test_turns_per_question_have_an_interval():
    """Turns per question come with a seeded bootstrap 95% interval of the mean, per row (the known set's 17
    questions: one search more or less moves the mean by 0.06), under the table and in the JSON rows."""
    turns = [1] * 11 + [2] * 6  # 17 questions, 6 searched first: 1.35
    lo, hi = mean_interval(turns)
    assert lo < sum(turns) / 17 < hi and mean_interval(turns) == (lo, hi) and mean_interval([]) is None
    assert mean_interval([1] * 17) == (1.0, 1.0)
    lo4, hi4 = mean_interval(turns[:4] + turns[-4:])
    assert hi4 - lo4 > hi - lo
    qs = [E.Question(f"q{i}", "What is 17*23?", ("391",), None) for i in range(4)]
    recs = [E.make_record(q, E.MODES["ssr"], _episode(["17*23"] if i == 0 else [], "391"))
            for i, q in enumerate(qs)]
    main = argparse.Namespace(questions=qs, records=recs, metrics={"ssr": E.mode_metrics(recs)})
    abl = [E.make_record(q, E.MODES["ssr-index"], _episode([], "391")) for q in qs[1:3]]
    ablation = argparse.Namespace(questions=qs[1:3], records=abl, metrics={"ssr-index": E.mode_metrics(abl)})
    rows = table_rows([main, ablation])
    assert [r["turns"] for r in rows] == [1.25, 1.0, 1.0]
    assert rows[0]["turns_ci95"] == mean_interval([2.0, 1.0, 1.0, 1.0])
    assert rows[1]["turns_ci95"] == rows[2]["turns_ci95"] == (1.0, 1.0)  # "ssr, same 2": q1 and q2 only
    md = markdown({"known": rows}, argparse.Namespace(model="m", split="dev", ablations=2, checks=0))
    lo, hi = rows[0]["turns_ci95"]
    assert f"known ssr 1.25 [{lo:.2f}-{hi:.2f}], known ssr-index 1.00 [1.00-1.00]." in md


def test_only_the_sets_asked_for_run():
    sets = {name: Path(f"{name}.jsonl") for name in ("factbook", "known", "followup", "check")}
    assert chosen_sets(sets, "") == sets
    assert list(chosen_sets(sets, " check, known")) == ["known", "check"]
    with pytest.raises(SystemExit, match="Unknown set.*facts.*Choose from: factbook, known, followup, check"):
        chosen_sets(sets, "facts")


def test_a_replayed_threshold_takes_the_passed_or_the_failed_run_by_the_checks_score(tmp_path):
    """scripts/replay_answer_check.py: a question whose check (scored from the passed run's tokens by
    today's answer_score) reaches the threshold takes the passed run's record, else the failed run's; a
    question with no check takes the passed run's."""
    from scripts.replay_answer_check import main, records, replay

    def rec(qid: str, question: str, contains: bool, turns: int, check: tuple | None) -> dict:
        checks = [{"pieces": list(check[0]), "logprobs": list(check[1])}] if check else []
        return {"id": qid, "mode": "ssr", "question": question, "contains": contains, "turns": turns,
                "answer_checks": checks}

    q = "What does DNA stand for?"
    passed = [rec("dna", q, True, 1, (["Deoxy", " acid", " stands"], [-0.3, -0.1, -2.0])),  # "stands": q's
              rec("peru", "What is the capital of Peru?", False, 1, (["Cusco"], [-0.5])),
              rec("sum", "What is 2*3?", True, 1, None)]
    failed = [rec("dna", q, True, 2, None), rec("peru", "What is the capital of Peru?", True, 2, None),
              rec("sum", "What is 2*3?", False, 2, None)]
    for run, rows in (("pass", passed), ("fail", failed)):
        (tmp_path / run / "known-main").mkdir(parents=True)
        (tmp_path / run / "known-main" / "results.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows + [{**rows[0], "mode": "freeform", "turns": 9}]))
    p, f = records(tmp_path / "pass"), records(tmp_path / "fail")
    assert replay(p, f, -0.1) == {"known": {"questions": 3, "right": 3, "turns": 5 / 3, "searched_first": 2}}
    assert replay(p, f, -0.3) == {"known": {"questions": 3, "right": 3, "turns": 4 / 3, "searched_first": 1}}
    assert replay(p, f, -0.6) == {"known": {"questions": 3, "right": 2, "turns": 1.0, "searched_first": 0}}
    assert main([str(tmp_path / "pass"), str(tmp_path / "fail"), "--thresholds", "-0.3"]) == 0
    with pytest.raises(SystemExit, match="not in the FAIL run"):
        replay(p, {}, -0.3)


def test_the_extra_known_questions_join_the_dev_known_set_only(tmp_path):
    """--known-extra adds the hand-written famous facts (scripts/data/known-extra-dev.jsonl) to the dev known
    set and so to its follow-ups; none asks a Factbook field's question (those split by country), and the
    test split refuses them."""
    import re

    from scripts.eval_quality import KNOWN_EXTRA, question_sets
    from scripts.factbook_questions import FIELDS

    data = tmp_path / "data"
    data.mkdir()
    for name in ("dev", "known-dev", "test", "known-test"):
        (data / f"{name}.jsonl").write_text(json.dumps({"id": f"{name}-1", "image": None, "question": "Q?",
                                                       "answers": ["a"]}) + "\n", encoding="utf-8")
    extra = E.load_dataset(KNOWN_EXTRA)
    sets = question_sets(tmp_path, "dev", KNOWN_EXTRA)
    known = E.load_dataset(sets["known"])
    assert [q.id for q in known] == ["known-dev-1"] + [q.id for q in extra] and len(extra) == 43
    assert len({q.id for q in known}) == len(known) and all(q.answers for q in extra)
    assert len(E.load_dataset(sets["followup"])) == 44
    assert len(E.load_dataset(question_sets(tmp_path, "dev")["known"])) == 1  # without: as before
    asks = [re.compile(re.escape(f.question).replace(re.escape("{country}"), ".+")) for f in FIELDS]
    assert not [q.question for q in extra if any(a.fullmatch(q.question) for a in asks)]
    with pytest.raises(SystemExit, match="for the dev split"):
        question_sets(tmp_path, "test", KNOWN_EXTRA)


def test_an_answer_after_a_search_is_grounded_when_its_added_words_are_in_the_results(tmp_path):
    """The what-if of scripts/replay_answer_check.py --grounding: an answer after a search whose words that
    add to the question are in none of its results did not come from them ("John Adams" after results on
    Norfolk Island's ninth Duke); counted as the answer from what the model knows instead."""
    from scripts.replay_answer_check import grounded, grounding

    q = "Who composed the Ninth Symphony?"
    norfolk = "Norfolk Island: named after Edward HOWARD, the ninth Duke of Norfolk"
    assert not grounded("John Adams composed the Ninth Symphony.", q, norfolk)
    assert grounded("Edward Howard composed it.", q, norfolk)  # "howard" is in the results
    assert grounded("The Ninth Symphony was composed.", q, norfolk)  # nothing added

    def rec(contains: bool, prediction: str, check: float | None, query: str = "") -> dict:
        return {"question": q, "contains": contains, "prediction": prediction, "turns": 1,
                "searches": [{"query": query}] if query else [],
                "answer_checks": [] if check is None else [{"pieces": ["Beethoven"], "logprobs": [check]}]}

    passed = {("known", "a"): rec(True, "Beethoven composed it.", -0.8),
              ("known", "b"): rec(True, "Beethoven composed it.", -0.1)}
    failed = {("known", "a"): rec(False, "John Adams composed the Ninth Symphony.", None, "ninth symphony"),
              ("known", "b"): rec(False, "John Adams composed it.", None, "ninth symphony")}
    (row,) = grounding(passed, failed, -0.225, lambda query: norfolk).values()
    assert row["right"] == 1 and row["right_if_grounded"] == 2
    assert [g["id"] for g in row["not_grounded"]] == ["a"] and row["not_grounded"][0]["knowledge_right"]
    with pytest.raises(SystemExit, match="not in the FAIL run"):
        grounding(passed, {}, -0.225, lambda query: norfolk)
