"""`edge-agent ask`: JSON lines, human output, text-only questions, exit codes and one-line errors
(real runtime, tiny Qwen3-VL models, offline search; nothing touches the network)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from edge_agent.commands.cli import cli


@pytest.fixture
def env(edge_home, monkeypatch):
    for k, v in {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "4096", "ANSWER_MAX_TOKENS": "5",
                 "FREEFORM_MAX_TOKENS": "6", "MAX_TURNS": "2"}.items():
        monkeypatch.setenv(f"EDGE_AGENT_{k}", v)
    return edge_home


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    p = tmp_path / "photo.jpg"
    Image.new("RGB", (80, 60), (120, 40, 40)).save(p)
    return p


def run(*args: str):
    return CliRunner().invoke(cli, ["ask", *args], catch_exceptions=False)


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_json_lines_end_with_the_final_answer(env, tiny_models, photo, mode):
    r = run(str(photo), "What colour is it?", "--model", str(tiny_models["text"]), "--mmproj",
            str(tiny_models["mmproj"]), "--mode", mode, "--offline", "--json", "--seed", "3")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[0]["event"] == "run_started" and rows[0]["mode"] == mode and rows[0]["image"] == str(photo)
    assert (rows[-1]["event"] == "final_answer"
            and rows[-1]["stop_reason"] in ("answered", "length", "turn_limit"))
    assert {"reasoning", "action", "tool", "total"} <= set(rows[-1]["totals"])
    kinds = {row["event"] for row in rows}
    assert (("rationale_scored" in kinds) == (mode == "ssr")
            and ("reasoning_done" in kinds) == (mode == "freeform"))


def test_human_output_is_the_answer_then_a_trace(env, tiny_models, photo):
    r = run(str(photo), "What colour is it?", "--model", str(tiny_models["text"]), "--mmproj",
            str(tiny_models["mmproj"]), "--offline", "--max-turns", "1")
    assert r.exit_code == 0, r.output
    # the answer alone on stdout (random weights may write a newline inside it); the trace on stderr
    assert r.stdout.strip() and "trace:" not in r.stdout and "turn 1:" not in r.stdout
    lines = r.stderr.splitlines()
    trace = lines.index("trace:")
    assert lines[trace + 1].startswith("turn 1: ")
    assert any(" p=" in ln and "rationale" in ln for ln in lines[trace:])
    assert "mode ssr" in lines[-2] and "ask --continue" in lines[-1] and "Traceback" not in r.output


def test_text_only_model_answers_without_an_image(env, tiny_models, tmp_path):
    lone = tmp_path / "lone" / "model.gguf"  # no mmproj next to it
    lone.parent.mkdir()
    shutil.copy(tiny_models["text"], lone)
    r = run("What is the capital of Peru?", "--model", str(lone), "--offline", "--json", "--max-turns", "1")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[-1]["event"] == "final_answer" and rows[0]["image"] is None


def test_errors_are_one_line_and_nonzero(env, tiny_models, photo, tmp_path):
    lone = tmp_path / "lone" / "model.gguf"
    lone.parent.mkdir()
    shutil.copy(tiny_models["text"], lone)
    r = run(str(photo), "What is this?", "--model", str(lone), "--offline")
    assert (r.exit_code == 2 and "cannot look at images" in r.stderr
            and len(r.stderr.strip().splitlines()) == 1)
    r = run(str(tmp_path / "missing.jpg"), "What?", "--model", str(tiny_models["text"]), "--mmproj",
            str(tiny_models["mmproj"]), "--offline")
    assert r.exit_code == 2 and r.stderr.startswith("Error: Image problem: Image file not found")
    r = run(str(photo), "What?", "--model", str(tmp_path / "nope.gguf"), "--offline")
    assert r.exit_code == 2 and r.stderr.startswith("Error: ") and "Traceback" not in r.output
    r = run(str(photo))
    assert r.exit_code == 2 and "give a question too" in r.output


def test_continue_follows_up_in_the_same_chat_without_reading_the_image_again(env, tiny_models, photo):
    """`ask` saves each question as a chat; `--continue` (the latest chat) and `--chat ID` restore the
    chat's saved context in a new process: only the new user turn is evaluated, and the app's chat
    list shows the same chat."""
    common = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--offline",
              "--json"]
    first = [json.loads(x) for x in run(str(photo), "What colour is it?", *common).stdout.splitlines()]
    assert first[-1]["context"]  # the state at the end of the answer was saved
    follow = run("--continue", "And its shape?", *common)
    assert follow.exit_code == 0, follow.output
    rows = [json.loads(x) for x in follow.stdout.splitlines()]
    opened = next(r for r in rows if r["event"] == "context_opened")
    assert opened["source"] == "restored" and opened["tokens_reused"] > 0
    # the photo stays in the restored context (a zoom's crop, which random weights may choose, is read anew)
    assert not [r for r in rows if r["event"] == "image_evaluated" and r["source"] == "image"]
    assert rows[-1]["totals"]["tokens_reused"] == opened["tokens_reused"]
    from edge_agent.chat.store import ChatStore
    from edge_agent.core.config import Settings

    store = ChatStore(Settings.load().chats_path)
    chats = store.list_chats()
    assert len(chats) == 1 and chats[0].n_messages == 4
    cont = store.continuation(chats[0].id)
    assert [q for q, _, _ in cont.exchanges] == ["What colour is it?", "And its shape?"]
    assert cont.image == str(photo.resolve()) and cont.context == rows[-1]["context"]
    store.close()
    by_id = run("--chat", str(chats[0].id), "Is it large?", *common)
    assert by_id.exit_code == 0, by_id.output
    assert next(json.loads(x) for x in by_id.stdout.splitlines()
                if '"context_opened"' in x)["source"] == "restored"
    listed = CliRunner().invoke(cli, ["chats"])
    assert listed.exit_code == 0 and "What colour is it?" in listed.output and "6 msgs" in listed.output


def test_continue_without_a_chat_or_with_a_wrong_id_says_what_to_do(env, tiny_models):
    common = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--offline"]
    r = CliRunner().invoke(cli, ["ask", "--continue", "And then?", *common])
    assert r.exit_code == 2 and "no chat to continue" in r.output
    r = CliRunner().invoke(cli, ["ask", "--chat", "999", "And then?", *common])
    assert r.exit_code == 2 and "There is no chat 999" in r.output and "edge-agent chats" in r.output


def test_no_save_leaves_the_chat_list_as_it_was(env, tiny_models, photo):
    """`--no-save`: answered as usual, nothing added to the chats; a follow-up with it still continues
    the saved chat's context, and the chat keeps only what was saved."""
    from edge_agent.chat.store import ChatStore
    from edge_agent.core.config import Settings

    common = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--offline"]
    r = run(str(photo), "What colour is it?", *common, "--no-save")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 1 and "not saved as a chat (--no-save)" in r.stderr
    store = ChatStore(Settings.load().chats_path)
    assert store.list_chats() == []
    store.close()
    assert run(str(photo), "What colour is it?", *common).exit_code == 0  # saved: chat 1
    follow = run("--continue", "And its shape?", *common, "--json", "--no-save")
    assert follow.exit_code == 0, follow.output
    opened = next(json.loads(x) for x in follow.stdout.splitlines() if '"context_opened"' in x)
    assert opened["source"] == "restored"
    store = ChatStore(Settings.load().chats_path)
    chats = store.list_chats()
    assert len(chats) == 1 and chats[0].n_messages == 2
    store.close()


def test_ask_reads_the_photo_while_the_prophet_loads(env, tiny_models, photo, monkeypatch):
    """Issue 19 item 3: `ask IMAGE QUESTION` (Engine.from_settings with ``ahead``) has its read-ahead (the
    system prompt, the photo, the whole question) under way before the prophet's files load; the question
    then evaluates nothing at Enter and says its photo was read ahead."""
    import threading

    from edge_agent.runtime import model as model_mod

    seen: list[bool] = []
    real = model_mod.Model.from_settings.__func__  # type: ignore[attr-defined]

    def spy(cls, settings, path, *a, **kw):
        if str(path) == str(tiny_models["prophet"]):
            seen.append(any(t.name == "read-ahead" for t in threading.enumerate()))
            time.sleep(0.5)  # a real prophet takes seconds to load, the tiny one milliseconds: on a busy
            # machine the read-ahead thread had not begun when the question started, and read nothing
        return real(cls, settings, path, *a, **kw)

    monkeypatch.setattr(model_mod.Model, "from_settings", classmethod(spy))
    r = run(str(photo), "What does the sign say?", "--model", str(tiny_models["text"]), "--mmproj",
            str(tiny_models["mmproj"]), "--prophet", str(tiny_models["prophet"]), "--prophet-mmproj",
            str(tiny_models["mmproj"]), "--offline", "--json")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert seen == [True]
    opened = next(row for row in rows if row["event"] == "context_opened")
    # everything was read ahead while the models loaded (the system prompt, the photo, the question):
    # evaluated by this process for this question, nothing at Enter, nothing reused
    assert opened["tokens_read_ahead"] > 0 and opened["tokens_evaluated"] == opened["tokens_read_ahead"]
    assert opened["tokens_reused"] == 0 and opened["source"] == "new" and not opened["system_restored"]
    assert [row["read_ahead"] for row in rows if row["event"] == "image_evaluated"
            and row["turn"] == 0] == [True]
    totals = rows[-1]["totals"]  # the answer's totals say the same: nothing reused on a fresh home
    assert totals["tokens_reused"] == 0 and totals["tokens_read_ahead"] == opened["tokens_read_ahead"]
    assert totals["tokens_evaluated"] > opened["tokens_evaluated"]  # + the turns' own tokens


def test_a_cut_answer_says_so_with_the_setting_to_raise(env, tiny_models, monkeypatch):
    """An answer that stopped at answer_max_tokens: stop_reason "length" in --json; on stderr a line that
    says it was cut and how to raise the limit (issue 30 item 4)."""
    import subprocess
    import sys

    monkeypatch.setenv("EDGE_AGENT_ANSWER_MAX_TOKENS", "2")
    monkeypatch.setenv("EDGE_AGENT_MAX_TURNS", "1")
    args = ["What is in a bicycle? Explain step by step.", "--model", str(tiny_models["text"]), "--mmproj",
            str(tiny_models["mmproj"]), "--offline",
            "--mode", "freeform"]
    r = run(*args, "--json")
    assert r.exit_code in (0, 1), r.output
    final = json.loads(r.output.strip().splitlines()[-1])
    assert final["event"] == "final_answer" and final["stop_reason"] == "length"
    assert final["totals"]["answer_tokens"] == 2
    p = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask", *args], capture_output=True,
                       text=True,
                       timeout=120)
    assert "cut off at 2 tokens" in p.stderr and "config set answer_max_tokens" in p.stderr, p.stderr


def test_the_trace_says_whole_why_a_move_was_taken_back():
    """`ask`'s trace cut a move's reason at 90 characters, before what it says comes instead ("... it zooms
    in first"); it shows it whole (we write it; it is bounded)."""
    from edge_agent.agent import events as ev
    from edge_agent.commands.ask import render_trace

    why = ("the model is not sure of its answer ('prelim'...: what it adds to the question has mean log-prob "
           "-5.11, and the next tokens could not bring it to answer_check -0.225): it zooms in first")
    trace = render_trace([ev.MoveWithdrawn(turn=1, action="answer", arguments={}, reason=why),
                          ev.TurnFinished(turn=1, action="zoom", reasoning_seconds=0.1, action_seconds=0.2,
                                          tool_seconds=0.0)], "ssr")
    assert f"  answer taken back: {why}" in trace.splitlines()
