"""Evaluation logic on scripted event streams (pure logic: a fake engine replays known events).

The real-model end-to-end run is in test_eval_e2e.py.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Collection
from pathlib import Path

import pytest

from edge_agent import evaluation as E
from edge_agent.agent import events as ev
from edge_agent.core.errors import ConfigError, EdgeAgentError, ImageError
from scripts import make_synthetic_vqa
from tests.fakes.engines import Asked, ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]

RATIONALES = [
    ("image_search", "image_search"),
    ("text_search", "text_search"),
    ("zoom", "zoom"),
    ("answer_evidence", "answer"),
    ("answer_image", "answer"),
    ("answer_knowledge", "answer"),
]


def scored(turn: int, chosen: str, seconds: float) -> ev.RationaleScored:
    cands = tuple(
        ev.RationaleCandidate(id=rid, text=f"I will {rid}.", action=act, score=-1.0, sum=-5.0, count=5,
                              prob=0.5 if rid == chosen else 0.1)
        for rid, act in RATIONALES
    )
    return ev.RationaleScored(turn=turn, candidates=cands, chosen=[r for r, _ in RATIONALES].index(chosen),
                              seconds=seconds)


def tool_turn(turn: int, *, rationale: str | None, action: str, reasoning: float, act: float = 0.1,
              tool: str = "image_zoom_in_tool", status: str = "local",
              tool_s: float = 0.01) -> list[ev.Event]:
    out: list[ev.Event] = [ev.TurnStarted(turn=turn)]
    if rationale:
        out.append(scored(turn, rationale, reasoning))
    else:
        out.append(ev.ReasoningDone(turn=turn, text="thinking", n_tokens=40, seconds=reasoning))
    out.append(ev.ToolCalled(turn=turn, name=tool, arguments={}, action_seconds=act))
    out.append(ev.ToolFinished(turn=turn, name=tool, ok=True, observation="obs", seconds=tool_s,
                               status=status))
    out.append(ev.TurnFinished(turn=turn, action=action, reasoning_seconds=reasoning, action_seconds=act,
                               tool_seconds=tool_s))
    return out


def answer_turn(turn: int, answer: str, *, rationale: str | None, reasoning: float, act: float = 0.2,
                action: str = "answer") -> list[ev.Event]:
    out: list[ev.Event] = [ev.TurnStarted(turn=turn)]
    out.append(scored(turn, rationale, reasoning) if rationale else
               ev.ReasoningDone(turn=turn, text="so", n_tokens=10, seconds=reasoning))
    out.append(ev.AnswerToken(turn=turn, text=answer))
    out.append(ev.TurnFinished(turn=turn, action=action, reasoning_seconds=reasoning, action_seconds=act,
                               tool_seconds=0.0))
    out.append(ev.FinalAnswer(answer=answer, turns=turn, stop_reason="answered", totals={}))
    return out


# Scripted outcomes per (mode, question id). Known by construction:
#   ssr: q1 zoom(0.1) -> "The word is Meadow." (contains, not exact), q2 text_search cached(0.2) -> "304"
#   (exact),
#        q3 answers "blue" (wrong) but the turn generated a zoom after an answer rationale (inconsistent).
#   freeform: q1 "meadow" exact (reasoning 1.0 + 2.0), q2 text_search live (3.0) -> "305" wrong, q3 "Orange."
#   exact.
SCRIPTS: dict[tuple[str, str], list[ev.Event]] = {
    ("ssr", "q1"): tool_turn(1, rationale="zoom", action="zoom", reasoning=0.1)
    + answer_turn(2, "The word is Meadow.", rationale="answer_image", reasoning=0.3),
    ("ssr", "q2"): tool_turn(1, rationale="text_search", action="text_search", reasoning=0.2,
                             tool="text_search", status="cached")
    + answer_turn(2, "304", rationale="answer_evidence", reasoning=0.4),
    ("ssr", "q3"): tool_turn(1, rationale="answer_image", action="zoom", reasoning=0.5)
    + answer_turn(2, "blue", rationale="answer_image", reasoning=0.6),
    ("freeform", "q1"): tool_turn(1, rationale=None, action="zoom", reasoning=1.0)
    + answer_turn(2, "meadow", rationale=None, reasoning=2.0),
    ("freeform", "q2"): tool_turn(1, rationale=None, action="text_search", reasoning=3.0, tool="text_search",
                                  status="live")
    + answer_turn(2, "305", rationale=None, reasoning=4.0),
    ("freeform", "q3"): answer_turn(1, "Orange.", rationale=None, reasoning=5.0),
}


def replaying(interrupt_at: int | None = None, fail: Collection[str] = ()) -> ScriptedEngine:
    """The scripted engine replaying SCRIPTS[(mode, question id)] (mode "ssr+seprod" with SeProD on);
    before its ``interrupt_at``-th question (from 0) it raises KeyboardInterrupt, and a question whose id
    is in ``fail`` raises an ImageError."""
    def replay(asked: Asked) -> list[ev.Event]:
        if len(engine.requests) - 1 == interrupt_at:
            raise KeyboardInterrupt
        name, qid = call(asked)
        if qid in fail:
            raise ImageError(f"cannot read image for {qid}")
        return [ev.RunStarted(question=asked.question, image=asked.image, mode=asked.mode,
                              seprod=asked.seprod,
                              model="scripted"), *SCRIPTS[(name, qid)]]

    engine = ScriptedEngine(script=replay)
    return engine


def call(asked: Asked) -> tuple[str, str]:
    """(mode, question id) of one question the engine was asked."""
    return "ssr+seprod" if asked.seprod else str(asked.mode), asked.question.split(":")[0]


def calls(engine: ScriptedEngine) -> list[tuple[str, str]]:
    """(mode, question id) of every question the engine ran (an interrupted one is not run)."""
    return [call(a) for a in engine.requests]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    img = tmp_path / "img.png"
    img.write_bytes(b"not needed by the scripted engine")
    rows = [
        {"id": "q1", "image": "img.png", "question": "q1: what word?", "answers": ["meadow"]},
        {"id": "q2", "image": "img.png", "question": "q2: what number?",
         "answers": ["304", "three hundred four"]},
        {"id": "q3", "image": None, "question": "q3: what colour?", "answers": ["orange"]},
    ]
    path = tmp_path / "DATA.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ---------------------------------------------------------------------------------------------


def test_normalize_and_match():
    """Case, punctuation, articles and whitespace are ignored; contains matches whole words only."""
    assert E.normalize_answer("  The  Eiffel-Tower!! ") == "eiffel tower"
    assert E.match_answer("An apple.", ["apple"]) == (True, True)
    assert E.match_answer("It is the apple, clearly", ["Apple"]) == (False, True)
    assert E.match_answer("pineapple", ["apple"]) == (False, False)
    assert E.match_answer("304", ["3 0 4", "304"]) == (True, True)
    assert E.match_answer("", ["x"]) == (False, False)
    # answers that normalise to nothing never match
    assert E.match_answer("anything", ["the", "!!"]) == (False, False)
    # accents folded
    assert E.match_answer("Chirripó Grande", ["Cerro Chirripo", "Chirripo"]) == (False, True)
    assert E.match_answer("Bogotá", ["Bogota"]) == (True, True)
    # a thousands separator is not a word break: "2,925" is 2925 (an eval answer wrote "equals 2,925.")
    assert E.match_answer("75 multiplied by 39 equals 2,925.", ["2925"]) == (False, True)
    assert E.match_answer("1,602 m", ["1602 m"]) == (True, True)
    assert E.match_answer("1,2 and 3", ["2"]) == (False, True) and E.normalize_answer("12,3456") == "12 3456"


def test_success_has_a_wilson_interval_and_repeats_are_counted():
    """95% Wilson interval (known values); a normalised query run twice in a question is one repeat."""
    from edge_agent.evaluation.metrics import repeated_searches, wilson

    lo, hi = wilson(8, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.49, 0.943)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0 and wilson(0, 0) is None
    rec = {"searches": [{"name": "text_search", "status": "live", "query": "Capital of Peru"},
                        {"name": "text_search", "status": "cached", "query": " capital of  peru"},
                        {"name": "text_search", "status": "live", "query": "Lima"}]}
    assert repeated_searches(rec) == 1


def test_parse_modes():
    """Mode names are case-insensitive, aliases accepted, order kept, unknown ones refused with the
    choices."""
    assert [m.name
            for m in E.parse_modes("Free-Form, SSR+SeProD,ssr,ssr")] == ["freeform", "ssr+seprod", "ssr"]
    assert E.parse_modes("ssr+seprod")[0].seprod and E.parse_modes("ssr+seprod")[0].engine_mode == "ssr"
    with pytest.raises(ConfigError, match="freeform, ssr, ssr\\+seprod, direct"):
        E.parse_modes("ssr,bogus")
    with pytest.raises(ConfigError):
        E.parse_modes(" , ")


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "line 1 is not valid JSON"),
        ('{"id": "a", "question": "q", "answers": []}', "answers"),
        ('{"id": "a", "question": "", "answers": ["x"]}', "question"),
        ('{"question": "q", "answers": ["x"]}', "'id'"),
        ('{"id": "a", "image": "missing.png", "question": "q", "answers": ["x"]}', "missing.png not found"),
        ('{"id": "a", "question": "q", "answers": ["x"]}\n{"id": "a", "question": "q", "answers": ["y"]}',
         "appears twice"),
        ("", "holds no questions"),
        ('{"id": "a", "question": "q", "answers": ["x"], "follows": ""}', "'follows' must be the text"),
    ],
)
def test_load_dataset_errors(tmp_path, line, match):
    """Every malformed question set is refused with a message naming the problem."""
    p = tmp_path / "d.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(E.DatasetError, match=match):
        E.load_dataset(p)


def test_load_dataset_resolves_images_and_limit(dataset):
    """Image paths resolve relative to the file; null image means text-only; limit takes the first N."""
    qs = E.load_dataset(dataset)
    assert [q.id for q in qs] == ["q1", "q2", "q3"]
    assert qs[0].image == dataset.parent / "img.png" and qs[2].image is None
    assert qs[1].answers == ("304", "three hundred four")
    assert len(E.load_dataset(dataset, limit=2)) == 2


def test_metrics_on_a_scripted_run(dataset, tmp_path):
    """Every metric of a scripted run equals the value worked out by hand from the script."""
    engines: list[ScriptedEngine] = []

    def factory():
        engines.append(replaying())
        return engines[-1]

    run = E.run_eval(dataset, "ssr,freeform", tmp_path / "out", factory)
    assert len(engines) == 1 and engines[0].closed  # models loaded once per run
    assert calls(engines[0]) == [("ssr", "q1"), ("freeform", "q1"), ("ssr", "q2"), ("freeform", "q2"),
                                ("ssr", "q3"), ("freeform", "q3")]
    m = run.metrics
    assert list(m) == ["ssr", "freeform"]
    ssr, ff = m["ssr"], m["freeform"]

    assert (ssr["success"]["exact"] == pytest.approx(1 / 3)
            and ssr["success"]["contains"] == pytest.approx(2 / 3))
    assert (ff["success"]["exact"] == pytest.approx(2 / 3)
            and ff["success"]["contains"] == pytest.approx(2 / 3))
    assert ssr["turns_per_question"]["mean"] == 2 and ff["turns_per_question"]["mean"] == pytest.approx(5 / 3)
    assert ssr["tool_calls"] == {"image_zoom_in_tool": 2, "text_search": 1}
    assert ff["tool_calls"] == {"image_zoom_in_tool": 1, "text_search": 1}
    assert ssr["tool_calls_per_question"] == 1.0

    # rationale mix over 6 scored turns: zoom 1, text_search 1, answer_image 3, answer_evidence 1
    assert ssr["scored_turns"] == 6
    assert ssr["rationale_mix"] == pytest.approx(
        {"zoom": 1 / 6, "text_search": 1 / 6, "answer_image": 3 / 6, "answer_evidence": 1 / 6})
    assert ssr["rationale_mix_by_action"] == pytest.approx({"zoom": 1 / 6, "text_search": 1 / 6,
                                                            "answer": 4 / 6})
    assert ssr["action_consistency"] == pytest.approx(5 / 6)  # q3 turn 1: answer rationale, zoom action
    assert ff["scored_turns"] == 0 and ff["action_consistency"] is None and ff["rationale_mix"] == {}

    # reasoning per turn: ssr [0.1,0.3,0.2,0.4,0.5,0.6]; freeform [1,2,3,4,5]
    r = ssr["reasoning_seconds_per_turn"]
    assert r["n"] == 6 and r["mean"] == pytest.approx(2.1 / 6)
    assert r["p50"] == pytest.approx(0.35) and r["p95"] == pytest.approx(0.575)
    rf = ff["reasoning_seconds_per_turn"]
    assert (rf["mean"] == pytest.approx(3.0) and rf["p50"] == pytest.approx(3.0)
            and rf["p95"] == pytest.approx(4.8))
    # model time per question = reasoning + action: ssr q1 0.1+0.1+0.3+0.2 = 0.7, q2 0.9, q3 1.4
    mt = ssr["model_seconds_per_question"]
    assert mt["mean"] == pytest.approx(3.0 / 3) and mt["p50"] == pytest.approx(0.9)

    # searches: ssr one cached; freeform one live
    assert ssr["cache_hits"] == 1 and ssr["cache_hit_rate"] == 1.0 and ssr["searches"]["cached"] == 1
    assert ff["cache_hits"] == 0 and ff["cache_hit_rate"] == 0.0 and ff["searches"]["live"] == 1
    # offline coverage: of the questions that searched, those whose searches all came from the cache;
    # questions that never searched are not counted as covered (issue 12)
    assert ssr["offline_coverage"] == {"questions": 1, "searched": 1, "share": 1.0, "without_search": 2}
    assert ff["offline_coverage"] == {"questions": 0, "searched": 1, "share": 0.0, "without_search": 2}
    assert ssr["errors"] == 0 and ssr["stop_reasons"] == {"answered": 3}


def test_a_follow_up_is_asked_after_its_earlier_question_in_the_same_chat(tmp_path):
    """A question with ``follows`` is the second of a chat: the earlier question runs first (same mode, no
    image), the follow-up continues its context with the exchange as history, and only the follow-up is
    scored and timed (its answer, turns, seconds). A fresh question is asked alone."""
    rows = [{"id": "f1", "image": None, "question": "What is 12*34?", "answers": ["408"],
             "follows": "What is the capital of Mongolia?"},
            {"id": "k1", "image": None, "question": "What is 19*28?", "answers": ["532"]}]
    path = tmp_path / "followup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def script(asked: Asked) -> list[ev.Event]:
        answer = {"What is the capital of Mongolia?": "Ulaanbaatar.", "What is 12*34?": "408.",
                  "What is 19*28?": "532."}[asked.question]
        first = asked.question.startswith("What is the capital")
        turns = [*tool_turn(1, rationale="text_search", action="text_search", reasoning=0.5,
                            tool="text_search", status="live")] if first else []
        last = answer_turn(len(turns) and 2 or 1, answer, rationale="answer_knowledge", reasoning=0.25)
        last[-1] = ev.FinalAnswer(answer=answer, turns=2 if first else 1, stop_reason="answered", totals={},
                                  context="ctx-1" if first else "ctx-2")
        return [ev.RunStarted(question=asked.question, image=None, mode=asked.mode, seprod=False,
                              model="scripted"), *turns, *last]

    engine = ScriptedEngine(script=script)
    run = E.run_eval(path, "ssr,direct", tmp_path / "out", lambda: engine)
    assert [(a.question, a.mode, a.context, a.history) for a in engine.requests] == [
        ("What is the capital of Mongolia?", "ssr", None, []),
        ("What is 12*34?", "ssr", "ctx-1", [("What is the capital of Mongolia?", "Ulaanbaatar.")]),
        ("What is the capital of Mongolia?", "direct", None, []),
        ("What is 12*34?", "direct", "ctx-1", [("What is the capital of Mongolia?", "Ulaanbaatar.")]),
        ("What is 19*28?", "ssr", None, []), ("What is 19*28?", "direct", None, [])]
    # every answer's background work is waited for before the next question: 4 records, 2 earlier questions
    assert engine.settled == 6
    f1 = next(r for r in run.records if r["id"] == "f1" and r["mode"] == "ssr")
    assert f1["prediction"] == "408." and f1["contains"] and f1["turns"] == 1 and f1["searches"] == []
    assert E.load_dataset(path)[0].follows == "What is the capital of Mongolia?"
    assert E.load_dataset(path)[1].follows is None

    def failing(asked: Asked) -> list[ev.Event]:
        return [ev.AgentError(turn=1, title="Context full", message="no room", fatal=True)]

    bad = E.run_eval(path, "ssr", tmp_path / "out2", lambda: ScriptedEngine(script=failing), limit=1)
    assert "The question before follow-up f1 failed: Context full" in bad.records[0]["error"]


def test_seprod_rounds_that_used_no_draft_are_counted_by_why(tmp_path):
    """SeProD's acceptance is over the drafts verified; the rounds that used none (DraftSkipped) are counted
    by reason beside it, in the record, the metrics and the report (a draft that diverged from the answer
    the agent had begun is not hidden by an acceptance rate over the others)."""
    from edge_agent.evaluation.report import _mode_rows

    rows = [{"id": f"k{i}", "image": None, "question": f"What is {i}*2?", "answers": [str(2 * i)]}
            for i in (1, 2)]
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def script(asked: Asked) -> list[ev.Event]:
        answer = asked.question.split()[-1].split("*")[0]
        draft = ([ev.DraftVerified(turn=1, mode="answering", accepted=3, drafted=4, accepted_text="abc",
                                   scores=(1.0, 1.0, 1.0, 0.0), seconds=0.0)] if answer == "1" else
                 [ev.DraftSkipped(turn=1, mode="answering", reason="diverged"),
                  ev.DraftSkipped(turn=2, mode="answering", reason="answered")])
        return [ev.RunStarted(question=asked.question, image=None, mode=asked.mode, seprod=True, model="s"),
                *draft, *answer_turn(1, answer, rationale="answer_knowledge", reasoning=0.1)]

    run = E.run_eval(path, "ssr", tmp_path / "out", lambda: ScriptedEngine(script=script))
    assert [r["drafts"]["skipped"] for r in run.records] == [{}, {"diverged": 1, "answered": 1}]
    sp = run.metrics["ssr"]["seprod"]
    assert (sp["rounds"], sp["drafted"], sp["accepted"]) == (1, 4, 3)
    assert sp["skipped"] == {"answered": 1, "diverged": 1}
    line = dict(_mode_rows(run.metrics["ssr"]))["SeProD drafts accepted"]
    assert line == "3/4 tokens (75.0%) in 1 rounds; 2 rounds used no draft (answered 1, diverged 1)"


def test_percentile_matches_numpy():
    """The percentile helper interpolates like numpy's default."""
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 5.0, 2.2, 0.7, 0.9, 1.4]
    for q in (0, 10, 50, 95, 100):
        assert E.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert E.percentile([], 50) is None


def test_resume_after_interrupt_gives_same_metrics(dataset, tmp_path):
    """Interrupted after 4 of 6 runs, a rerun runs only the other 2, writes no duplicates, and ends
    with the same metrics as an uninterrupted run."""
    full = E.run_eval(dataset, "ssr,freeform", tmp_path / "full", replaying)

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        E.run_eval(dataset, "ssr,freeform", out, lambda: replaying(interrupt_at=4))
    lines = (out / E.RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 4

    engines: list[ScriptedEngine] = []
    second = E.run_eval(dataset, "ssr,freeform", out, lambda: engines.append(replaying()) or engines[-1])
    assert calls(engines[0]) == [("ssr", "q3"), ("freeform", "q3")]
    assert second.ran == 2
    keys = [(json.loads(x)["mode"], json.loads(x)["id"])
            for x in (out / E.RESULTS_FILE).read_text().splitlines()]
    assert len(keys) == 6 and len(set(keys)) == 6

    def untimed(metrics):
        return {k: {kk: vv for kk, vv in v.items() if kk != "wall_seconds_per_question"}
                for k, v in metrics.items()}

    assert untimed(second.metrics) == untimed(full.metrics)

    # A third run has nothing to do and loads no model.
    third = E.run_eval(dataset, "ssr,freeform", out, lambda: pytest.fail("engine created for a finished run"))
    assert third.ran == 0 and untimed(third.metrics) == untimed(full.metrics)


def test_partial_last_line_is_dropped_and_rerun(dataset, tmp_path):
    """A line cut off by a kill mid-write is discarded, and that question runs again on a clean line."""
    out = tmp_path / "out"
    E.run_eval(dataset, "ssr", out, replaying, limit=2)
    path = out / E.RESULTS_FILE
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:37])  # a torn third record
    run = E.run_eval(dataset, "ssr", out, replaying)
    assert run.ran == 1
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]


def test_corrupt_middle_line_is_a_clear_error(dataset, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / E.RESULTS_FILE).write_text("garbage\n")
    with pytest.raises(EdgeAgentError, match="corrupt line"):
        E.run_eval(dataset, "ssr", out, replaying)


def test_changed_settings_are_refused(dataset, tmp_path):
    """Resuming with settings that change results is refused, naming the setting; new modes are fine."""
    out = tmp_path / "out"
    E.run_eval(dataset, "ssr", out, replaying, fingerprint={"model": "a.gguf", "max_turns": 3}, limit=1)
    with pytest.raises(ConfigError, match="max_turns: 3 -> 4"):
        E.run_eval(dataset, "ssr", out, replaying, fingerprint={"model": "a.gguf", "max_turns": 4})
    run = E.run_eval(dataset, "ssr,freeform", out, replaying, fingerprint={"model": "a.gguf", "max_turns": 3})
    assert len(run.records) == 6


def test_engine_error_is_recorded_and_the_run_continues(dataset, tmp_path):
    """A user-fixable error on one question becomes that question's failed result, not a crash."""
    run = E.run_eval(dataset, "ssr", tmp_path / "out", lambda: replaying(fail={"q2"}))
    rec = {r["id"]: r for r in run.records}
    assert rec["q2"]["error"].startswith("Image problem") and not rec["q2"]["exact"]
    assert rec["q3"]["error"] is None
    m = run.metrics["ssr"]
    assert m["errors"] == 1 and m["success"]["exact"] == pytest.approx(0.0)
    oc = m["offline_coverage"]
    # the one question that would have searched (q2) failed: nothing ran from the cache
    assert oc["questions"] == 0


def test_cancel_stops_without_recording_the_cancelled_question(dataset, tmp_path):
    cancel = threading.Event()
    seen = []

    def progress(done, total, rec):
        seen.append(done)
        if done == 2:
            cancel.set()

    run = E.run_eval(dataset, "ssr", tmp_path / "out", replaying, on_progress=progress, cancel=cancel)
    assert seen == [0, 1, 2] and len(run.records) == 2


def test_outputs_json_report_and_plot(dataset, tmp_path):
    """The JSON holds metrics and records; the report has a table per mode and the rationale mix; the plot is
    a PNG."""
    pytest.importorskip("matplotlib")
    run = E.run_eval(dataset, "freeform,ssr", tmp_path / "out", replaying, fingerprint={"model": "m.gguf"})
    paths = E.write_outputs(run)
    data = json.loads(paths["json"].read_text())
    assert data["metrics"]["ssr"]["success"]["exact_count"] == 1 and len(data["records"]) == 6
    report = paths["report"].read_text()
    for heading in ("## Summary", "## Mode: freeform", "## Mode: ssr", "## Rationale mix", "## Answers"):
        assert heading in report
    assert "| Action-type consistency | 83.3% of 6 scored turns |" in report
    assert "![reasoning time per turn and rationale mix](plot.png)" in report
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_matplotlib(dataset, tmp_path, monkeypatch):
    """Without matplotlib the report says so and how to get the plot; nothing crashes."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    run = E.run_eval(dataset, "ssr", tmp_path / "out", replaying)
    paths = E.write_outputs(run)
    assert paths["plot"] is None and not (tmp_path / "out" / "plot.png").exists()
    assert "matplotlib is not installed" in paths["report"].read_text()


def test_synthetic_set_is_deterministic_and_loads(tmp_path):
    """The same seed gives byte-identical files; another seed differs; the eval loader accepts the set."""
    mk = make_synthetic_vqa
    a = mk.make_dataset(tmp_path / "a", n=6, seed=3, size=(800, 600))
    b = mk.make_dataset(tmp_path / "b", n=6, seed=3, size=(800, 600))
    c = mk.make_dataset(tmp_path / "c", n=6, seed=4, size=(800, 600))
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    for name in sorted(p.name for p in (a.parent / "images").iterdir()):
        assert (a.parent / "images" / name).read_bytes() == (b.parent / "images" / name).read_bytes()
    qs = E.load_dataset(a)
    assert len(qs) == 6 and all(q.image is not None and q.answers for q in qs)
    rows = [json.loads(x) for x in a.read_text().splitlines()]
    assert {r["kind"] for r in rows} == set(mk.KINDS)
    # the target is small: under 5% of the image side, so the model must zoom to read it
    for r in rows:
        x1, y1, x2, y2 = r["target_bbox_1000"]
        assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000 and (x2 - x1) < 80 and (y2 - y1) < 80


def test_synthetic_default_size(tmp_path):
    from PIL import Image

    mk = make_synthetic_vqa
    data = mk.make_dataset(tmp_path, n=1)
    with Image.open(tmp_path / "images" / "svqa-000.png") as im:
        assert im.size == (1600, 1200)
    assert json.loads(data.read_text())["answers"]


def test_offline_coverage_and_cache_hits_by_status():
    """A question that searched ran from the cache when every search was cached, stale or unconfigured
    (none live, no offline miss, no error); unconfigured searches are not counted as cache lookups."""

    def rec(*statuses):
        events = [ev.ToolFinished(turn=1, name="text_search", ok=True, observation="", seconds=0.0, status=s)
                  for s in statuses]
        events.append(ev.ToolFinished(turn=1, name="image_zoom_in_tool", ok=False, observation="",
                                      seconds=0.0, status="error"))
        events.append(ev.FinalAnswer(answer="x", turns=1, stop_reason="answered"))
        q = E.Question("q", "q?", ("x",), None)
        return E.make_record(q, E.MODES["ssr"], events)

    records = [rec("cached", "unconfigured"), rec("stale"), rec(), rec("offline"), rec("error"),
               rec("live", "cached"),
               rec("unconfigured")]
    m = E.mode_metrics(records)
    # rec() and rec("unconfigured") never reached a search backend: not evidence of coverage (issue 12)
    assert m["offline_coverage"] == {"questions": 2, "searched": 5, "share": 0.4, "without_search": 2}
    assert m["searches"]["total"] == 6 and m["searches"]["unconfigured"] == 2
    assert m["cache_hits"] == 3 and m["cache_hit_rate"] == 0.5
    assert m["tool_calls"] == {}  # no ToolCalled events in this stream


def test_cli_runs_resumes_and_reports(dataset, tmp_path, monkeypatch):
    """`edge-agent eval` with an injected engine: progress, outputs, a resumed rerun loads nothing."""
    from click.testing import CliRunner

    from edge_agent.commands import eval as eval_cmd
    from edge_agent.commands.cli import cli

    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path / "home"))
    made = []
    monkeypatch.setattr(eval_cmd, "engine_factory",
                        lambda settings, on_status=None: lambda: made.append(settings) or replaying())
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(cli,
                        ["eval", str(dataset), "--modes", "freeform,ssr", "--out", str(out), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert len(made) == 1 and made[0].prophet == ""
    assert "freeform" in res.output and "66.7%" in res.output and "Report:" in res.output
    assert ((out / "report.md").exists() and (out / "results.json").exists()
            and not (out / "plot.png").exists())

    res = runner.invoke(cli, ["eval", str(dataset), "--modes", "freeform,ssr", "--out", str(out), "--json",
                              "--no-plot"])
    assert res.exit_code == 0, res.output
    assert len(made) == 1  # everything was already done: no engine
    payload = json.loads(res.stdout)
    assert payload["metrics"]["ssr"]["success"]["exact_count"] == 1

    res = runner.invoke(cli, ["eval", str(dataset), "--out", str(out), "--max-turns", "2"])
    assert res.exit_code == 2 and "other settings" in res.output and "max_turns" in res.output


def test_cli_refuses_seprod_without_prophet_and_bad_input(dataset, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    res = runner.invoke(cli, ["eval", str(dataset), "--modes", "ssr+seprod", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "needs a prophet" in res.output
    res = runner.invoke(cli, ["eval", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 2 and "Question file not found" in res.output
    res = runner.invoke(cli, ["eval", str(dataset), "--modes", "fast"])
    assert res.exit_code == 2 and "Unknown eval mode" in res.output


def test_model_time_prefers_episode_totals():
    """Model time is the episode's total minus tool time when the engine reports totals (prompt prefill
    and observations count), else reasoning + action + observe summed over turns."""
    q = E.Question("q", "q?", ("x",), None)
    turn = ev.TurnFinished(turn=1, action="zoom", reasoning_seconds=0.25, action_seconds=0.5,
                           tool_seconds=4.0,
                           observe_seconds=0.125)
    with_totals = E.make_record(q, E.MODES["ssr"],
                                [turn, ev.FinalAnswer("x", 1, "answered", {"total": 6.0, "tool": 4.0})])
    assert with_totals["model_seconds"] == 2.0 and with_totals["turn_model_seconds"] == 0.875
    without = E.make_record(q, E.MODES["ssr"], [turn, ev.FinalAnswer("x", 1, "answered", {})])
    assert without["model_seconds"] == 0.875


def test_answers_are_rescored_against_the_current_file(dataset, tmp_path):
    """Fixing the answer key and rerunning re-scores the stored predictions without running anything."""
    out = tmp_path / "out"
    first = E.run_eval(dataset, "ssr", out, replaying)
    assert first.metrics["ssr"]["success"]["exact_count"] == 1
    rows = [json.loads(x) for x in dataset.read_text().splitlines()]
    rows[2]["answers"] = ["blue"]  # ssr answered "blue" for q3
    dataset.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    second = E.run_eval(dataset, "ssr", out, lambda: pytest.fail("nothing to run"))
    assert second.metrics["ssr"]["success"]["exact_count"] == 2
    assert {r["id"]: r["answers"] for r in second.records}["q3"] == ["blue"]


def test_evaluation_imports_no_model_ui_or_plot_library():
    """The eval logic stays importable without llama.cpp, Textual or matplotlib (the plot is optional)."""
    import subprocess

    code = ("import sys, edge_agent.evaluation, edge_agent.commands.eval; "
            "bad = [m for m in ('llama_cpp', 'textual', 'matplotlib') if m in sys.modules]; print(bad); "
            "sys.exit(bool(bad))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
