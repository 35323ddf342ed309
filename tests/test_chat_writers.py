"""One chat, one writer at a time (issue 30 item 2): two questions to one chat at once (two `ask --chat N`
in subprocesses; the app and `ask`) never fork it: the second waits for the first, saying so, and the
saved context the chat continues from is the one its visible exchanges make (compared token by token
with the prompt rebuilt from them, on the tiny Qwen3-VL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.chat.lock import ChatLock
from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings

SMALL = {"EDGE_AGENT_N_THREADS": "1", "EDGE_AGENT_N_THREADS_BATCH": "1", "EDGE_AGENT_N_CTX": "2048",
         "EDGE_AGENT_ANSWER_MAX_TOKENS": "8", "EDGE_AGENT_MAX_TURNS": "1", "EDGE_AGENT_OFFLINE": "true"}


def ask(tiny_models, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edge_agent.commands.cli", "ask", *args, "--model", str(tiny_models["text"]),
           "--mmproj", str(tiny_models["mmproj"])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **SMALL})


def done(p: subprocess.Popen) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def test_two_asks_to_one_chat_at_once_keep_context_and_transcript_in_step(edge_home: Path, tiny_models):
    from edge_agent.agent.direct import Exchange, _elements, messages, prompt_segments
    from edge_agent.runtime import Model
    from edge_agent.runtime.chat_template import render
    from edge_agent.runtime.state import StateStore

    code, _, err = done(ask(tiny_models, "What is red?", "--mode", "direct"))
    assert code in (0, 1), err
    store = ChatStore(edge_home / "chats.sqlite3")
    (chat,) = [c.id for c in store.list_chats()]
    store.close()
    both = [ask(tiny_models, "--chat", str(chat), q, "--mode", "direct")
            for q in ("Is it warm?", "Is it loud?")]
    results = [done(p) for p in both]
    assert all(code in (0, 1) for code, _, _ in results), results
    assert sum("waiting for it" in err for _, _, err in results) == 1, [err for _, _, err in results]
    store = ChatStore(edge_home / "chats.sqlite3")
    cont = store.continuation(chat)
    store.close()
    visible = [(q, a) for q, a, _ in cont.exchanges]
    assert [q for q, _ in visible][0] == "What is red?" and sorted(q for q, _ in visible[1:]) == [
        "Is it loud?", "Is it warm?"]
    # the saved context of the last answer holds exactly the prompt of the visible exchanges, then that answer
    settings = Settings.load(env={**os.environ, **SMALL})  # the subprocesses' (a state's key includes n_ctx)
    model = Model.from_settings(settings, tiny_models["text"], tiny_models["mmproj"])
    try:
        state = StateStore(settings.states_dir, 2**30).get(cont.context, model.identity)
        assert state is not None
        s = model.session()
        segs = prompt_segments(lambda m: render(model.chat_template, m),
                               messages([Exchange(q, a) for q, a in visible[:-1]], visible[-1][0]))
        rebuilt = [e[1] for e in _elements(s, segs)]
        assert state.history[: len(rebuilt)] == rebuilt
        assert model.detokenize(state.history[len(rebuilt):]).strip().startswith(visible[-1][1])
    finally:
        model.close()


@pytest.mark.asyncio
async def test_the_app_refuses_a_question_to_a_chat_ask_is_answering(edge_home: Path, tmp_path: Path):
    """A chat `ask` holds (here: its lock, as an `ask` in another process takes it) is refused in the app
    with who holds it; nothing is added to the chat, the question stays in the prompt."""
    from edge_agent.ui.widgets.prompt import PromptInput
    from tests.pilot import scripted_app, settle, type_and_enter

    settings = Settings.load()
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "first question")
        await settle(pilot)
        chat = app.chat_screen.chat_id
        other = ChatLock(settings.home, chat, "edge-agent ask")
        assert other.try_acquire()
        try:
            await type_and_enter(pilot, "second question")
            await settle(pilot)
            assert len(engines[0].asked) == 1
            assert any("edge-agent ask (pid" in n.message and n.title == "Chat busy"
                       for n in app._notifications)
            assert app.chat_screen.query_one(PromptInput).value == "second question"
            assert [m.text for m in app.store.load(chat).messages if m.role == "user"] == ["first question"]
        finally:
            other.release()
        app.chat_screen.query_one(PromptInput).focus()
        await pilot.press("enter")
        await settle(pilot)
        assert len(engines[0].asked) == 2  # free again: the same question goes


@pytest.mark.asyncio
async def test_a_new_chat_is_held_from_when_it_is_made_until_its_answer_is_saved(edge_home: Path,
                                                                                 tmp_path: Path):
    """A question in a new chat holds no lock before the chat exists (nothing is written until the model
    read it, see chat.recorder); the chat is claimed as it is made, so an `ask --chat` in another process
    waits for the answer, and it is free again once the answer is saved."""
    from tests.pilot import scripted_app, settle, type_and_enter
    from tests.waits import pilot_wait_until

    settings = Settings.load()
    app, _ = scripted_app(settings, tmp_path, hold=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "first question")
        await pilot_wait_until(pilot, lambda: app.chat_screen.chat_id is not None, what="the chat to be made")
        chat = app.chat_screen.chat_id
        assert chat is not None
        other = ChatLock(settings.home, chat, "edge-agent ask")
        assert not other.try_acquire() and "the edge-agent app" in other.holder()
        await pilot.press("escape")
        await settle(pilot)
        assert other.try_acquire()
        other.release()
        assert app.store.load(chat).messages[-1].status == "cancelled"
