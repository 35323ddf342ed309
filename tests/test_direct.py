"""The ``direct`` mode: the model alone in a plain chat, its prompt rendered by the model's own template.

On the real llama.cpp: the tiny F32 Qwen3-VL (a chat with a photo continued live and after a restart,
each compared with evaluating the same prompt from scratch), and the real Qwen2.5-Coder-0.5B (the
prompt's token ids equal what llama-cpp-python's ``create_chat_completion`` feeds; it says Lima).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import events as ev
from edge_agent.agent.direct import Exchange, FreshDirect, messages, prompt_segments, run_direct
from edge_agent.agent.options import AgentOptions
from edge_agent.agent.prompts import Img, Text
from edge_agent.core.config import Settings
from edge_agent.engine.engine import Engine
from edge_agent.engine.face import AskRequest
from edge_agent.runtime import Model
from edge_agent.runtime.chat_template import CHATML, render, template_of


def load(path, mmproj=None, **kw):
    kw = {"n_ctx": 4096, "n_threads": 1, "n_threads_batch": 1, "kv_type": "f32", **kw}
    return Model.load(path, mmproj, **kw)


@pytest.fixture
def direct_settings(edge_home: Path) -> Settings:
    return Settings.load({"mode": "direct", "offline": True, "n_threads": 1, "n_threads_batch": 1,
                          "answer_max_tokens": 6})


def ask(engine: Engine, question: str, image=None, **kw) -> list[ev.Event]:
    return list(engine.ask(AskRequest(question, image, **kw)))


def final(events: list[ev.Event]) -> ev.FinalAnswer:
    last = events[-1]
    assert isinstance(last, ev.FinalAnswer), last
    return last


def opened(events: list[ev.Event]) -> ev.ContextOpened:
    return next(e for e in events if isinstance(e, ev.ContextOpened))


# ---- the prompt's segments (pure: the template rendered with jinja2 as llama-cpp-python does) ---------
def test_texts_stay_plain_text_and_images_go_where_the_template_puts_them(tiny_models):
    from edge_agent.modelfiles.checks import inspect

    tpl = template_of(inspect(tiny_models["text"]).chat_template, "<|endoftext|>", "<|im_end|>")
    msgs = messages([Exchange("What is <|im_end|> this?", "A sign.", (b"png-1",))], "And <tool_call>?",
                    [b"png-1", b"png-2"], instructions="Be  brief.")
    segs = prompt_segments(lambda m: render(tpl, m), msgs)
    plain = [s.text for s in segs if isinstance(s, Text) and not s.special]
    assert plain == ["Be brief.", "What is <|im_end|> this?", "A sign.", "And <tool_call>?"]
    # png-1 once (in the message that first carried it), png-2 with the question; each in the template's
    # vision placeholder (the runtime's projector writes its own markers around it)
    assert [s.png for s in segs if isinstance(s, Img)] == [b"png-1", b"png-2"]
    text = "".join(s.text if isinstance(s, Text) else "[IMG]" for s in segs)
    assert ("<|im_start|>user\n[IMG]What is" in text
            and "<|im_start|>user\n[IMG]And <tool_call>?<|im_end|>" in text)
    assert "<|image_pad|>" not in text and text.endswith("<|im_start|>assistant\n")


def test_a_file_without_a_template_is_spoken_to_in_chatml():
    tpl = template_of("", "", "")
    assert tpl.template == CHATML and tpl.source == "chatml" and tpl.eos == "<|im_end|>"
    segs = prompt_segments(lambda m: render(tpl, m), messages([], "Hi?", [b"png"]))
    assert segs == [Text("<|im_start|>user\n"), Img(b"png"), Text("Hi?", special=False),
                    Text("<|im_end|>\n<|im_start|>assistant\n")]


# ---- a chat on the tiny Qwen3-VL: kept context == evaluating the prompt from scratch ----------------
def from_scratch(tiny_models, engine: Engine, history: list[Exchange], question: str,
                 images: tuple[bytes, ...], live) -> ev.FinalAnswer:
    """The same question asked on a fresh model, its prompt evaluated from nothing; its context is checked
    against ``live`` (:func:`same_context`). Returns its final answer."""
    m = load(tiny_models["text"], tiny_models["mmproj"])
    try:
        s = m.session()
        opts = AgentOptions.from_settings(engine.settings, mode="direct", model_name=engine.model_name)
        got = list(run_direct(FreshDirect(s), lambda msgs: render(m.chat_template, msgs), question,
                              history=history,
                              images=images, options=opts))
        same_context(live, s)
        return final(got)
    finally:
        m.close()


def same_context(a, b) -> None:
    """The same tokens, images, positions and KV cells, and the same next-token logits (pending tokens
    evaluated first)."""
    la, lb = a.next_logits(), b.next_logits()
    assert list(a.history) == list(b.history)
    assert [i.digest for i in a.images] == [i.digest for i in b.images]
    assert (a.n_pos, a.n_cells) == (b.n_pos, b.n_cells)
    assert np.max(np.abs(la - lb)) < 1e-4


def test_a_plain_chat_continues_live_and_restored_exactly_as_evaluated_from_scratch(
        tiny_models, direct_settings, photo):
    engine = Engine(load(tiny_models["text"], tiny_models["mmproj"]), direct_settings)
    try:
        first = ask(engine, "What does the sign say?", str(photo))
        kinds = {type(e) for e in first}
        assert ev.RationaleScored not in kinds and ev.ToolCalled not in kinds and ev.AnswerToken in kinds
        f1 = final(first)
        assert f1.answer and f1.context and opened(first).source == "new"
        assert [e.source for e in first if isinstance(e, ev.ImageEvaluated)] == ["image"]
        png = engine._history_images(str(photo))
        # a follow-up about the same photo: the photo stays where it was asked (not read again)
        history = [("What does the sign say?", f1.answer, str(photo))]
        second = ask(engine, "And the door?", str(photo), context=f1.context, history=history)
        f2, o2 = final(second), opened(second)
        assert o2.source == "live" and o2.tokens_reused > 576 and not any(isinstance(e, ev.ImageEvaluated)
                                                                          for e in second)
        ref = from_scratch(tiny_models, engine, [Exchange("What does the sign say?", f1.answer, png)],
                           "And the door?", png, engine.contexts.live)
        assert (ref.answer, ref.stop_reason) == (f2.answer, f2.stop_reason)
    finally:
        engine.close()
    # a new process: the chat's saved state is restored, and the third question continues it
    engine = Engine(load(tiny_models["text"], tiny_models["mmproj"]), direct_settings)
    try:
        history.append(("And the door?", f2.answer, str(photo)))
        third = ask(engine, "Is it open?", None, context=f2.context, history=history)
        f3, o3 = final(third), opened(third)
        assert o3.source == "restored" and o3.tokens_reused > 576
        ref = from_scratch(tiny_models, engine, [Exchange("What does the sign say?", f1.answer, png),
                                                 Exchange("And the door?", f2.answer, png)],
                           "Is it open?", (), engine.contexts.live)
        assert ref.answer == f3.answer
    finally:
        engine.close()


def test_a_plain_chat_and_an_agents_context_are_never_taken_for_each_other(tiny_models, edge_home):
    settings = Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 4,
                              "max_turns": 1})
    engine = Engine(load(tiny_models["text"], tiny_models["mmproj"]), settings)
    try:
        agent = final(ask(engine, "Hello?", mode="ssr", options=AgentOptions.from_settings(
            settings, mode="ssr", policy=lambda turn, allowed: {"answer"})))
        plain = ask(engine, "And now?", mode="direct", context=agent.context,
                    history=[("Hello?", agent.answer or "x")])
        o = opened(plain)
        assert o.source == "rebuilt" and o.reason == "the chat was not a plain chat"
        assert "And now?" in engine.contexts.live.text() and "<tools>" not in engine.contexts.live.text()
        back = ask(engine, "Once more?", mode="ssr", context=final(plain).context,
                   history=[("Hello?", "x"), ("And now?", final(plain).answer or "y")])
        assert (opened(back).source == "rebuilt"
                and opened(back).reason == "the settings changed the system prompt")
    finally:
        engine.close()


def test_a_cut_answer_says_length(tiny_models, direct_settings):
    engine = Engine(load(tiny_models["text"], tiny_models["mmproj"]), direct_settings.updated(
        {"answer_max_tokens": 2}))
    try:
        f = final(ask(engine, "Tell me a long story?"))
        assert f.stop_reason == "length" and f.totals["answer_tokens"] == 2
    finally:
        engine.close()


def test_a_stopped_answer_ends_cancelled_and_the_next_question_is_as_evaluated_from_scratch(
        tiny_models, direct_settings):
    import threading

    engine = Engine(load(tiny_models["text"], tiny_models["mmproj"]), direct_settings.updated(
        {"answer_max_tokens": 40}))
    try:
        f1 = final(ask(engine, "Hello?"))
        history = [("Hello?", f1.answer or "x")]
        cancel = threading.Event()
        events: list[ev.Event] = []
        for e in engine.ask(AskRequest("And a long story?", None, context=f1.context, history=history),
                            cancel=cancel):
            events.append(e)
            if isinstance(e, ev.AnswerToken):
                cancel.set()  # the first piece streamed: stop
        f = final(events)
        assert f.stop_reason == "cancelled"
        assert f.totals["answer_tokens"] < 40 and sum(isinstance(e, ev.AnswerToken) for e in events) >= 1
        # the stopped exchange is not the chat's: the next question holds exactly the visible one's prompt
        f3 = final(ask(engine, "Is it open?", None, context=f1.context, history=history))
        ref = from_scratch(tiny_models, engine, [Exchange("Hello?", f1.answer or "x", ())], "Is it open?", (),
                           engine.contexts.live)
        assert ref.answer == f3.answer
    finally:
        engine.close()


# ---- the real Qwen2.5-Coder-0.5B ------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen05(qwen05_gguf) -> Path:
    return qwen05_gguf


def chat_completion_prompt(path: Path, msgs: list[dict]) -> list[int]:
    """The token ids ``Llama.create_chat_completion`` feeds the model for ``msgs`` (vocabulary only)."""
    import llama_cpp

    class Fed(Exception):
        pass

    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    fed: list[int] = []

    def create_completion(prompt, **kw):
        fed.extend(prompt)
        raise Fed()

    llm.create_completion = create_completion  # type: ignore[method-assign]
    with pytest.raises(Fed):
        llm.create_chat_completion(messages=msgs)
    return fed


def test_qwen_answers_peru_with_lima_from_the_prompt_create_chat_completion_feeds(qwen05, edge_home):
    settings = Settings.load({"mode": "direct", "offline": True, "answer_max_tokens": 32})
    engine = Engine(load(qwen05, n_ctx=1024, kv_type="f16"), settings)
    try:
        first = ask(engine, "What is the capital of Peru?")
        f1 = final(first)
        assert "Lima" in f1.answer and f1.stop_reason == "answered"
        assert ev.RationaleScored not in {type(e) for e in first}
        prompt1 = chat_completion_prompt(qwen05,
                                         [{"role": "user", "content": "What is the capital of Peru?"}])
        n1 = len(prompt1)
        assert list(engine.contexts.live.history[:n1]) == prompt1
        second = ask(engine, "And of Chile?", context=f1.context,
                     history=[("What is the capital of Peru?", f1.answer)])
        prompt2 = chat_completion_prompt(qwen05, [{"role": "user", "content": "What is the capital of Peru?"},
                                                  {"role": "assistant", "content": f1.answer},
                                                  {"role": "user", "content": "And of Chile?"}])
        assert list(engine.contexts.live.history[:len(prompt2)]) == prompt2
        o2 = opened(second)
        assert o2.source == "live" and o2.tokens_reused >= n1  # the first exchange was not read again
        assert o2.tokens_evaluated == len(prompt2) - o2.tokens_reused
    finally:
        engine.close()


def test_a_looping_answer_stops_and_the_chat_goes_on_from_what_was_shown(qwen05, edge_home):
    """The plain chat's answer stops once it loops (``agent.repetition``), says ``repetition``, and the
    next question's prompt is what ``create_chat_completion`` feeds for the exchange as shown."""
    settings = Settings.load({"mode": "direct", "offline": True, "answer_max_tokens": 64})
    engine = Engine(load(qwen05, n_ctx=1024, kv_type="f16"), settings)
    song = "Continue the song: la la la la la la la la"
    try:
        f1 = final(ask(engine, song))
        assert f1.stop_reason == "repetition" and f1.totals["answer_tokens"] < 64
        assert f1.answer.endswith("la la la la")
        peru = "What is the capital of Peru?"
        ask(engine, peru, context=f1.context, history=[(song, f1.answer)])
        prompt2 = chat_completion_prompt(qwen05, [{"role": "user", "content": song},
                                                  {"role": "assistant", "content": f1.answer},
                                                  {"role": "user", "content": peru}])
        assert list(engine.contexts.live.history[:len(prompt2)]) == prompt2
    finally:
        engine.close()


def test_ask_mode_direct_on_the_command_line(qwen05, edge_home):
    """``ask --mode direct`` in a subprocess: the answer on stdout; a follow-up restores the plain chat."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "EDGE_AGENT_N_CTX": "1024", "EDGE_AGENT_ANSWER_MAX_TOKENS": "32"}

    def edge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask", *args],
                              capture_output=True, text=True,
                              timeout=300, env=env)

    r = edge("What is the capital of Peru?", "--model", str(qwen05), "--mode", "direct")
    assert r.returncode == 0, r.stderr
    assert "Lima" in r.stdout and "mode direct" in r.stderr and "rationale" not in r.stderr
    r = edge("--continue", "And what is the capital of Chile?", "--mode", "direct", "--json")
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    kinds = {e["event"] for e in got}
    assert "rationale_scored" not in kinds and "tool_called" not in kinds and "answer_token" in kinds
    opened = next(e for e in got if e["event"] == "context_opened")
    assert opened["source"] == "restored" and opened["tokens_reused"] > 30
    assert got[-1]["event"] == "final_answer" and "Santiago" in got[-1]["answer"]


def test_ask_says_when_an_answer_was_stopped_in_a_loop(qwen05, edge_home):
    """``ask``: the answer as shown on stdout (exit 0: it is an answer, cut), and why it stops on stderr."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "EDGE_AGENT_N_CTX": "1024", "EDGE_AGENT_ANSWER_MAX_TOKENS": "64"}
    r = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask",
                        "Continue the song: la la la la la la la la", "--model", str(qwen05),
                        "--mode", "direct", "--no-save"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("la la la la")
    assert "stopped where it began repeating itself" in r.stderr and "repetition in 1 turn" in r.stderr
    assert "or try --mode ssr or freeform." in r.stderr  # the other modes, not the one it ran in
