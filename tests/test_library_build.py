"""`library build` as pure logic: hand-made traces with a known structure (which moves recur, under
which action, with which specifics), the three source formats, and the messages for bad sources.

The real-model path (a SmolLM2 free-form eval, embeddings, `library show`) is in
tests/test_library_real.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_agent.agent import events as ev
from edge_agent.agent.rationales import load_library
from edge_agent.library.build import build_library
from edge_agent.library.cluster import cluster, lexical_vectors, normalise
from edge_agent.library.generalise import decision_sentence, generalise
from edge_agent.library.readers import LibraryBuildError, Read, Turn, read_sources
from edge_agent.library.write import write_library

# Three moves, each written several ways with question-specific details; the structure the build
# must recover: zoom x6 (two phrasings), text_search x4, answer x6 (two phrasings), one stray.
ZOOM_A = ['The sign is small. I should zoom in on the sign to read "{w}"',
          'I cannot read the {n} words on the sign. I should zoom in on the sign to read it',
          "I should zoom in on the sign at [{n}, 40, 300, 200] to read it"]
ZOOM_B = ["Let me zoom in closer on the tag in the corner", "Let me zoom in closer on the tag near {name}",
          "Let me zoom in closer on the tag"]
SEARCH = ["I should search the web for facts about {name}", 'I should search the web for facts about "{w}"',
          "I need facts. I should search the web for facts about {name} Tower",
          "I should search the web for facts about the {n} buildings"]
ANSWER_A = ["The crop shows it clearly. I can answer from the image now", "I can answer from the image now",
            "I can answer from the image now: it says {w}"]
ANSWER_B = ["I know this already, so I will answer from what I know",
            "The search gave {n} results. I will answer from what I know",
            "I will answer from what I know about {name}"]
NAMES = ["Prague", "Eiffel", "Lisbon", "Marie Curie", "Tokyo", "Berlin"]
WORDS = ["harbor", "lantern", "meadow", "copper", "falcon", "velvet"]


def _fill(t: str, i: int) -> str:
    return t.format(w=WORDS[i % len(WORDS)], n=3 + i, name=NAMES[i % len(NAMES)])


def _turns() -> list[Turn]:
    out = []
    q = 0
    for texts, action in ((ZOOM_A, "zoom"), (ZOOM_B, "zoom"), (SEARCH, "text_search"), (ANSWER_A, "answer"),
                          (ANSWER_B, "answer")):
        for t in texts:
            out.append(Turn(trace=f"set:q{q}", turn=1, text=_fill(t, q), action=action, correct=True))
            q += 1
    out.append(Turn(trace="set:q99", turn=1, text="Hmm, maybe the colour of the dog matters", action="zoom",
                       correct=True))
    return out


def _read(turns: list[Turn]) -> Read:
    return Read(turns=turns, traces=len({t.trace for t in turns}))


# --- generalising one turn ---------------------------------------------------------------------

def test_generalise_keeps_the_decision_sentence_and_drops_specifics():
    """Quoted strings, numbers, boxes and names go; the sentence that says what to do stays."""
    m = generalise('The question is about the Old Town Hall in Prague. It has 3 towers. '
                      'I should search for "astronomical clock 1410" to find out.')
    assert m is not None and m.text == "I should search for it to find out" and m.placeholders == 1
    m = generalise("Let me zoom into [120, 40, 380, 260] to read the tag.")
    assert m is not None and m.text == "Let me zoom into it to read the tag"
    m = generalise("The answer is 42 and I can answer from the evidence now.")
    assert m is not None and not re.search(r"\d", m.text)
    m = generalise("I should answer that Marie Curie discovered it, as Wikipedia says.")
    assert m is not None and "Marie" not in m.text and "Curie" not in m.text


def test_generalise_removes_chat_markup_and_rejects_garbage():
    """Nothing that breaks the chat format survives; text without a generic move gives None."""
    m = generalise("<|im_start|>assistant <think> I will answer now </think><tool_call>")
    assert m is not None and m.text == "I will answer now"
    assert all(f not in m.text for f in ("<|", "<think>", "<tool_call>"))
    assert generalise("") is None
    assert generalise("%% 12 ## <|im_end|> $$ 7 ~~") is None
    assert generalise("ok then") is None  # under three words
    # the prompt's words
    assert generalise("You have no tool calls left. Give your final answer now.") is None
    assert generalise("You can't search for something new.") is None  # a tool's note to the model


def test_decision_sentence_skips_a_sentence_cut_off_by_the_token_limit():
    assert decision_sentence("The sky is blue.\n\nThe sky is blue.\n\nThe") == "The sky is blue."
    assert decision_sentence("I should zoom in on the sign") == "I should zoom in on the sign"
    assert decision_sentence("I will search the web. Then the") == "I will search the web."
    assert decision_sentence("I know it. I should search the web for it") == "I should search the web for it"


def test_a_text_under_two_actions_is_kept_once_for_answering():
    """When the same words led to a search and to an answer, the answer keeps them: a library needs
    an answer move, and two identical candidates would score alike."""
    same = "The capital of the country is a city"
    turns = [Turn(f"s:q{i}", 1, same, "text_search", True) for i in range(5)]
    turns += [Turn(f"s:q{i}", 2, same, "answer", True) for i in range(2)]
    b = build_library(_read(turns))
    assert [(e.action, e.size) for e in b.entries] == [("answer", 2)]
    assert any("leads to answer" in d for d in b.dropped)


def test_generalise_cuts_long_text_at_a_word_boundary():
    m = generalise("I should " + "zoom in very carefully and " * 20 + "read the sign", max_chars=60)
    assert (m is not None and len(m.text) <= 60 and not m.text.endswith(" ")
            and m.text.startswith("I should zoom"))


# --- clustering ---------------------------------------------------------------------------------

def test_cluster_recovers_planted_groups_largest_first():
    """Rows near three directions form three clusters; weights order them."""
    rng = np.random.default_rng(0)
    centres = np.eye(3)
    rows, labels = [], []
    for k, n in ((0, 3), (1, 5), (2, 2)):
        for _ in range(n):
            rows.append(centres[k] + 0.1 * rng.standard_normal(3))
            labels.append(k)
    v = normalise(np.array(rows))
    clusters = cluster(v, [1] * len(rows), threshold=0.5)
    assert [sorted({labels[i] for i in c}) for c in clusters] == [[1], [0], [2]]
    assert sorted(len(c) for c in clusters) == [2, 3, 5]
    # weights count turns: one row standing for 10 turns outranks five single rows
    weights = [1] * len(rows)
    weights[-1] = 10
    assert {labels[i] for i in cluster(v, weights, threshold=0.5)[0]} == {2}


def test_cluster_threshold_one_keeps_distinct_texts_apart():
    v = lexical_vectors(["I should zoom in", "I should search the web", "I should zoom in"])
    assert len(cluster(v, [1, 1, 1], threshold=1.01)) == 3
    assert len(cluster(v, [1, 1, 1], threshold=0.99)) == 2  # the identical pair merges


# --- the build ----------------------------------------------------------------------------------

def test_build_finds_the_recurring_moves_per_action():
    """Hand-made traces with two zoom moves, one search move and two answer moves: the library has
    exactly those, generic, each with its cluster's provenance; the stray turn is left out."""
    b = build_library(_read(_turns()))
    got = {(e.action, e.size) for e in b.entries}
    assert got == {("zoom", 3), ("text_search", 4),
                   ("answer", 3)} or sorted(e.size for e in b.entries) == [3, 3, 3, 3, 4]
    assert [e.action for e in b.entries].count("zoom") == 2 and [e.action
                                                                 for e in b.entries].count("answer") == 2
    assert len(b.entries) == 5 and b.used == 17
    texts = " ".join(e.text for e in b.entries)
    for specific in NAMES + WORDS + ["Tower", '"', "[", "]"]:
        assert specific not in texts
    assert not re.search(r"\d", texts)
    assert all(e.share == pytest.approx(e.size / 17) for e in b.entries)
    assert sum(e.size for e in b.entries) == 16  # everything but the stray turn
    assert any("min-support" in d for d in b.dropped)
    ids = [e.id for e in b.entries]
    assert ids == sorted(ids, key=lambda i: ("image_search", "text_search", "zoom",
                                             "answer").index(i.rsplit("_", 1)[0]))
    # the representative with no placeholder and the shortest text wins
    assert "I can answer from the image now" in [e.text for e in b.entries]
    assert next(e for e in b.entries if e.text == "I can answer from the image now").needs_image
    search = next(e for e in b.entries if e.action == "text_search")
    assert search.examples[0].startswith("set:q") and "#t1" in search.examples[0]


def test_build_caps_per_action_and_in_all(tmp_path):
    """--per-action and the global cap (never above the runtime's 15) hold; the biggest answer stays."""
    b = build_library(_read(_turns()), per_action=1)
    assert sorted(e.action for e in b.entries) == ["answer", "text_search", "zoom"]
    assert any("--per-action 1" in d for d in b.dropped)
    b = build_library(_read(_turns()), max_total=1)
    assert [e.action for e in b.entries] == ["answer"]
    many = [Turn(f"s:q{i}-{j}", 1, f"I should zoom in on the {w} part of it", "zoom", True)
            for i, w in enumerate(["left", "right", "upper", "lower", "middle", "far", "near", "inner",
                                   "outer",
                                   "red", "blue", "green", "dark", "bright", "small", "large", "odd", "top"])
            for j in range(2)]
    many += [Turn("s:a", 1, "I can answer now", "answer", True),
             Turn("s:b", 1, "I can answer now", "answer", True)]
    b = build_library(_read(many), per_action=20, max_total=99, similarity=1.01)
    assert len(b.entries) == 15 and sum(e.action == "answer" for e in b.entries) == 1
    out = write_library(b, tmp_path / "lib.json")
    assert len(load_library(out)) == 15


def test_build_uses_only_correct_turns_unless_all():
    turns = _turns()
    wrong = [Turn("set:bad", 1, "I should search the image on the web now", "image_search", False),
             Turn("set:bad", 2, "I should search the image on the web now", "image_search", False)]
    b = build_library(_read(turns + wrong))
    assert b.skipped_failed == 2 and all(e.action != "image_search" for e in b.entries)
    b = build_library(_read(turns + wrong), take_all=True)
    assert any(e.action == "image_search" for e in b.entries)


def test_build_errors_say_what_to_do():
    failed = [Turn(f"s:q{i}", 1, "I can answer from the image now", "answer", False) for i in range(3)]
    with pytest.raises(LibraryBuildError, match="--all"):
        build_library(_read(failed))
    with pytest.raises(LibraryBuildError, match="freeform"):
        build_library(Read(traces=2, scored_turns=4))
    garbage = [Turn(f"s:q{i}", 1, "## 12 %% <|im_end|>", "answer", True) for i in range(3)]
    with pytest.raises(LibraryBuildError, match="generic move"):
        build_library(_read(garbage))
    no_answer = [Turn(f"s:q{i}", 1, "I should zoom in on the sign", "zoom", True) for i in range(3)]
    with pytest.raises(LibraryBuildError, match="answer"):
        build_library(_read(no_answer))


def test_build_with_an_embedder_uses_its_vectors():
    """The embed callable decides the clusters: a fake that maps every zoom text to one vector merges
    phrasings the lexical vectors keep apart."""
    def embed(texts):
        return np.array([[1.0, 0.0, 0.0] if "zoom" in t.lower() else [0.0, 1.0, 0.0] if "search" in t.lower()
                         else [0.0, 0.0, 1.0] for t in texts])

    b = build_library(_read(_turns()), embed=embed, method="fake")
    assert b.method == "fake"
    assert [e.size for e in b.entries if e.action == "zoom"] == [6]  # both phrasings in one cluster


# --- sources ------------------------------------------------------------------------------------

def _events(turns: list[tuple[str, str]], *, stop: str = "answered") -> list[ev.Event]:
    out: list[ev.Event] = [ev.RunStarted(question="q?", image=None, mode="freeform", seprod=False, model="m")]
    for n, (text, action) in enumerate(turns, 1):
        out += [ev.TurnStarted(turn=n), ev.ReasoningDone(turn=n, text=text, n_tokens=5, seconds=0.1),
                ev.TurnFinished(turn=n, action=action, reasoning_seconds=0.1, action_seconds=0.1,
                                tool_seconds=0.0)]
    out.append(ev.FinalAnswer(answer="x", turns=len(turns), stop_reason=stop))
    return out


def _record(qid: str, turns: list[tuple[str, str]], *, correct: bool, mode: str = "freeform") -> dict:
    log = [{"turn": n, "action": a, "rationale": None if mode == "freeform" else "zoom",
            **({"reasoning": t} if mode == "freeform" else {})} for n, (t, a) in enumerate(turns, 1)]
    return {"id": qid, "mode": mode, "turn_log": log, "exact": correct, "contains": correct, "error": None}


TRACE = [("I should zoom in on the sign", "zoom"), ("I can answer from the image now", "answer")]


def test_reads_eval_results_folder_json_and_jsonl(tmp_path):
    recs = [_record("q1", TRACE, correct=True), _record("q2", TRACE, correct=False),
            _record("q1", TRACE, correct=True, mode="ssr")]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "results.json").write_text(json.dumps({"records": recs, "metrics": {}}))
    for src in (tmp_path / "run", tmp_path / "run" / "results.jsonl", tmp_path / "results.json"):
        r = read_sources([src])
        assert r.traces == 3 and r.scored_turns == 2
        assert [(t.trace.split(":")[1], t.turn, t.action, t.correct) for t in r.turns] == [
            ("q1", 1, "zoom", True), ("q1", 2, "answer", True), ("q2", 1, "zoom", False),
            ("q2", 2, "answer", False)]


def test_records_in_any_order_read_the_same(tmp_path):
    """A cluster run's results.jsonl holds its records in the order they arrived: the turns read (and so the
    library built) do not depend on the lines' order."""
    recs = [_record(f"q{i}", [(f"I should zoom in on part {i}", "zoom"), TRACE[1]], correct=True)
            for i in range(4)]
    reads = []
    for k, order in enumerate((recs, recs[::-1], recs[2:] + recs[:2])):
        (tmp_path / f"r{k}").mkdir()
        (tmp_path / f"r{k}" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
        reads.append([(t.trace.split(":")[1], t.turn, t.text)
                      for t in read_sources([tmp_path / f"r{k}"]).turns])
    assert reads[0] == reads[1] == reads[2] and len(reads[0]) == 8


def test_reads_eval_records_made_by_the_eval_itself(tmp_path):
    """The eval's own record (make_record from real events) carries the reasoning text per turn."""
    from edge_agent import evaluation as E

    q = E.Question("q1", "q?", ("x",), None)
    rec = E.make_record(q, E.MODES["freeform"], _events(TRACE))
    (tmp_path / "results.jsonl").write_text(json.dumps(rec) + "\n")
    r = read_sources([tmp_path])
    assert [(t.text, t.action, t.correct) for t in r.turns] == [(TRACE[0][0], "zoom", True),
                                                                (TRACE[1][0], "answer", True)]


def test_reads_an_exported_chat_and_an_ask_json_log(tmp_path):
    from edge_agent.chat import export as chat_export
    from edge_agent.chat.store import ChatStore

    chats = ChatStore(tmp_path / "chats.sqlite3")
    cid = chats.new_chat("t")
    for stop, status in (("answered", "answered"), ("cancelled", "cancelled")):
        chats.add_user_message(cid, "q?")
        mid = chats.start_answer(cid)
        for e in _events(TRACE, stop=stop):
            chats.add_event(mid, e)
        chats.finish_answer(mid, status, "x")
    _, jpath = chat_export.export(chats, cid, tmp_path / "export")
    r = read_sources([jpath])
    assert r.traces == 2 and [t.correct for t in r.turns] == [None, None, False, False]
    assert {t.action for t in r.turns} == {"zoom", "answer"}

    log = tmp_path / "ask.jsonl"
    lines = [json.dumps(e.to_json()) for e in _events(TRACE) + _events(TRACE[1:])]
    log.write_text("\n".join(lines) + "\n")
    r = read_sources([log])
    assert r.traces == 2 and [(t.trace, t.turn) for t in r.turns] == [("ask:run1", 1), ("ask:run1", 2),
                                                                      ("ask:run2", 1)]
    assert all(t.correct is None for t in r.turns)


@pytest.mark.parametrize("content, match", [
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8"),
    (b"this is not json\nat all", "neither JSON nor JSON lines"),
    (b'{"hello": "world"}', "not an eval result"),
    (b'[1, 2, 3]', "not an eval result"),
])
def test_garbage_sources_get_a_clear_message(tmp_path, content, match):
    p = tmp_path / "src.json"
    p.write_bytes(content)
    with pytest.raises(LibraryBuildError, match=match):
        read_sources([p])


def test_missing_source_and_folder_without_results(tmp_path):
    with pytest.raises(LibraryBuildError, match="not found"):
        read_sources([tmp_path / "nope.json"])
    with pytest.raises(LibraryBuildError, match="without results"):
        read_sources([tmp_path])


# --- the command line ---------------------------------------------------------------------------

def _eval_file(tmp_path: Path, correct: bool = True) -> Path:
    recs = []
    for i, t in enumerate(_turns()):
        recs.append(_record(f"q{i}", [(t.text, t.action)] + ([] if t.action == "answer" else [TRACE[1]]),
                            correct=correct))
    p = tmp_path / "results.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_cli_build_then_check(tmp_path, edge_home):
    from edge_agent.commands.cli import cli

    src = _eval_file(tmp_path)
    out = tmp_path / "lib" / "mine.json"
    res = CliRunner().invoke(cli, ["library", "build", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "Wrote" in res.output and "answer_1" in res.output
    data = json.loads(out.read_text())
    assert data["built"]["method"].startswith("lexical") and data["built"]["sources"] == [str(src)]
    assert all({"cluster_size", "share", "examples"} <= set(r["provenance"]) for r in data["rationales"])
    res = CliRunner().invoke(cli, ["library", "check", str(out)])
    assert res.exit_code == 0 and f"OK: {out} holds {len(data['rationales'])} rationales" in res.output
    data["rationales"][0]["text"] = "I should <think> twice"
    out.write_text(json.dumps(data))
    res = CliRunner().invoke(cli, ["library", "check", str(out)])
    assert res.exit_code == 2 and "would break the chat format" in res.output


def test_cli_build_all_failed_and_garbage(tmp_path, edge_home):
    from edge_agent.commands.cli import cli

    src = _eval_file(tmp_path, correct=False)
    res = CliRunner().invoke(cli, ["library", "build", str(src), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "answered wrongly or failed" in res.output and "--all" in res.output
    assert not (tmp_path / "x.json").exists()
    res = CliRunner().invoke(cli, ["library", "build", str(src), "--all", "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 0, res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = CliRunner().invoke(cli, ["library", "build", str(bad), "-o", str(tmp_path / "y.json")])
    assert res.exit_code == 2 and "Error:" in res.output and "SOURCES are" in res.output



def test_cli_build_all_does_not_suggest_all(tmp_path, edge_home):
    """With --all already given, a build that finds no answering move suggests what is left to change."""
    from edge_agent.commands.cli import cli

    recs = [_record(f"q{i}", [("I should zoom in on the sign", "zoom")], correct=False) for i in range(3)]
    src = tmp_path / "results.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = CliRunner().invoke(cli, ["library", "build", str(src), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "--all" in res.output  # without it, --all is the first thing to try
    res = CliRunner().invoke(cli, ["library", "build", str(src), "--all", "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "No answering move" in res.output, res.output
    assert "--all" not in res.output and "--min-support 1" in res.output

# --- eval --rationales --------------------------------------------------------------------------

def test_with_libraries_gives_one_column_per_library_for_each_ssr_mode():
    from edge_agent import evaluation as E

    specs = E.with_libraries(E.parse_modes("freeform,ssr,ssr+seprod"), ["builtin", "mine"])
    assert [s.name for s in specs] == ["freeform", "ssr[builtin]", "ssr[mine]", "ssr+seprod[builtin]",
                                       "ssr+seprod[mine]"]
    assert (specs[2].library, specs[2].engine_mode, specs[2].seprod) == ("mine", "ssr", False)
    assert specs[4].seprod and specs[0].library == ""
    assert E.with_libraries(E.parse_modes("ssr"), []) == E.parse_modes("ssr")


def test_library_ask_hands_each_column_its_library(edge_home):
    """The same engine answers every column; only the scored library changes."""
    from edge_agent import evaluation as E
    from edge_agent.agent.rationales import builtin_library
    from edge_agent.core.config import Settings

    class Engine:
        settings = Settings.load()
        calls: list = []

        library = None

        def ask(self, request, *, cancel=None):
            library = request.options.library if request.options else None
            self.calls.append((request.mode, request.seprod, library))
            return iter(())

    mine = load_library(None)  # any Library object stands for "mine"
    ask = E.library_ask({"builtin": builtin_library(), "mine": mine})
    eng = Engine()
    q = E.Question("q1", "q?", ("x",), None)
    for spec in E.with_libraries(E.parse_modes("freeform,ssr"), ["builtin", "mine"]):
        list(ask(eng, spec, q, None))
    assert [c[0] for c in eng.calls] == ["freeform", "ssr", "ssr"]
    assert eng.calls[0][2] is None and eng.calls[2][2] is mine and eng.calls[1][2].source == "built-in"


def test_eval_refuses_a_bad_library_before_loading_a_model(tmp_path, edge_home):
    from edge_agent.commands.cli import cli

    data = tmp_path / "DATA.jsonl"
    data.write_text(json.dumps({"id": "q1", "image": None, "question": "q?", "answers": ["x"]}) + "\n")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    res = CliRunner().invoke(cli, ["eval", str(data), "--modes", "ssr", "--rationales", f"builtin,{bad}",
                                   "--out", str(tmp_path / "out"), "--model", str(tmp_path / "none.gguf")])
    assert res.exit_code == 2 and "holds no rationales" in res.output
    assert not (tmp_path / "out").exists()


def test_building_without_a_model_imports_no_llama_cpp():
    """The lexical build, `library check` and the eval's library plumbing load no model runtime."""
    import subprocess
    import sys

    code = ("import sys, edge_agent.library.build, edge_agent.library.write, edge_agent.commands.library, "
            "edge_agent.evaluation; "
            "print([m for m in ('llama_cpp', 'textual') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
