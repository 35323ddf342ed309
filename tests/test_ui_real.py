"""Pilot tests of the app with the real engine: tiny random-weight Qwen3-VL GGUFs (+ mmproj, + a
prophet) loaded by llama.cpp through ``Engine.from_settings`` in the app's worker thread.

Random weights give gibberish text, so these check structure and behaviour: the model loads with
progress, an attached image reaches the model, SSR blocks hold the six scored rationales, free-form
blocks hold generated reasoning, SeProD drafts show their counts, Escape stops a long generation and
the chat stays usable, a chat exports, a model that cannot see images yields a titled error.
Offline settings: the search tools answer from an empty cache; nothing touches the network.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import Markdown, Static

from edge_agent.agent import events as ev
from edge_agent.core.config import Settings
from edge_agent.runtime import vision
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.widgets.readable import readable_markdown
from edge_agent.ui.widgets.reasoning import TurnView
from tests.files import make_image
from tests.pilot import settle, type_and_enter
from tests.waits import pilot_wait_until

pytestmark = pytest.mark.asyncio

SIZE = (120, 40)


@pytest.fixture
def real_settings(edge_home, tiny_models) -> Settings:
    return Settings.load({
        "model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
        "offline": True, "n_threads": 1, "n_threads_batch": 1, "n_ctx": 4096,
        "answer_max_tokens": 6, "freeform_max_tokens": 8, "max_turns": 2,
    })


@pytest.fixture
def photo(tmp_path) -> Path:
    return make_image(tmp_path / "photo.png", (96, 64))


def stored_events(app) -> list[ev.Event]:
    chat = app.store.load(app.chat_screen.chat_id)
    return [e for m in chat.messages for e in m.events]


async def test_real_engine_attach_ask_reasoning_and_export(real_settings, photo, tmp_path):
    """The model loads in a worker; /image + a question run the real agent; the SSR block holds six
    rationales with probabilities summing to 1; the stored chat exports with its scores."""
    app = EdgeAgentApp(real_settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.host.state == "ready", [n.message for n in app._notifications]
        assert app.host.engine.model_name  # status bar shows the real model's name
        assert app.host.engine.model_name in str(app.chat_screen.status.render())
        vision.clear_cache()  # the same pixels may have been encoded by an earlier test in this process
        encodes = app.host.engine.model.vision_encodes
        await type_and_enter(pilot, f"/image {photo}")
        # attaching reads the photo ahead: its vision encode happens before the question
        await pilot_wait_until(pilot, lambda: app.host.engine.model.vision_encodes == encodes + 1,
                               what="the photo encoded on attach")
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        assert view.status in ("answered", "length", "turn_limit"), view.status
        image_read = [e for e in stored_events(app) if isinstance(e, ev.ImageEvaluated)
                      and e.source == "image"]
        assert image_read and image_read[0].read_ahead  # read into the context on attach, not at Enter
        assert app.host.engine.model.vision_encodes == encodes + 1 + sum(
            1 for e in stored_events(app) if isinstance(e, ev.ImageEvaluated) and e.source == "crop"
            and not e.reused)
        assert view.turns and all(isinstance(t, TurnView) for t in view.turns.values())
        events = stored_events(app)
        started = next(e for e in events if isinstance(e, ev.RunStarted))
        assert started.image == str(photo.resolve()) and started.mode == "ssr"
        scored = [e for e in events if isinstance(e, ev.RationaleScored)]
        # image_search is not configured and text search offline with nothing cached, so their rationales
        # are not scored (the tool policy), nor is "answer from the evidence" before any tool result
        assert scored and [c.id for c in scored[0].candidates] == ["zoom", "answer_image", "answer_knowledge"]
        assert "image_search" not in {c.action for c in scored[0].candidates}
        assert abs(sum(c.prob for c in scored[0].candidates) - 1) < 1e-6
        assert len(view.turns[1].query(".rationales")) == 1
        final = next(e for e in events if isinstance(e, ev.FinalAnswer))
        assert view.text == final.answer  # shown as readable Markdown (random weights write ">>>>" too)
        assert view.query_one(Markdown).source == readable_markdown(final.answer)
        out = tmp_path / "exports"
        await type_and_enter(pilot, f"/export {out}")
    data = json.loads(next(out.glob("*.json")).read_text())
    kinds = [e["event"] for e in data["messages"][1]["events"]]
    assert kinds[0] == "run_started" and kinds[-1] == "final_answer" and "rationale_scored" in kinds
    assert "| **>** |" in next(out.glob("*.md")).read_text()


async def test_attaching_and_typing_slowly_reads_the_photo_and_the_words_ahead(real_settings, photo):
    """Issue 19 in the app: the photo is read into the context on attach and the question's words while
    they are typed; the answer's image line says "read on attach" and its context line how many of the
    question's tokens were read before Enter."""
    app = EdgeAgentApp(real_settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        engine = app.host.engine
        await type_and_enter(pilot, f"/image {photo}")
        await pilot_wait_until(pilot, lambda: engine.ahead is not None and engine.ahead.image is not None,
                               what="the photo read into the context on attach")
        for ch in "What colour is the sign":
            await pilot.press("space" if ch == " " else ch)
        await pilot_wait_until(pilot, lambda: engine.ahead is not None and engine.ahead.question_tokens > 0,
                               what="the words typed read ahead")
        await type_and_enter(pilot, "?")
        await settle(pilot)
        events = stored_events(app)
        opened = next(e for e in events if isinstance(e, ev.ContextOpened))
        assert opened.question_tokens_read_ahead > 0 and opened.tokens_read_ahead > 0
        lines = str(app.chat_screen.transcript.answers()[0].query_one(".context-note", Static).render())
        assert ("read on attach" in lines
                and f"{opened.question_tokens_read_ahead} question tokens read ahead" in lines)


async def test_real_engine_escape_cancels_then_next_question_runs(real_settings, photo):
    """Free-form mode with a long reasoning budget: Esc while tokens stream stops the model (the worker
    ends soon after), the answer reads 'cancelled', and a second question is answered."""
    settings = real_settings.updated({"mode": "freeform", "freeform_max_tokens": 4000,
                                      "answer_max_tokens": 4000})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {photo}")
        await type_and_enter(pilot, "Describe every detail.")
        view = app.chat_screen.transcript.answers()[0]
        await pilot_wait_until(pilot, lambda: any(t.query(".freeform") for t in view.turns.values()),
                               timeout=60)
        await pilot.press("escape")
        await pilot.pause()
        assert view.status == "cancelled" and app.chat_screen.running is None
        await settle(pilot, timeout=60)  # the worker saw the cancel and released the model
        assert not app.host.lock.locked()
        app.change_settings({"freeform_max_tokens": 8, "answer_max_tokens": 6})
        await type_and_enter(pilot, "And now briefly?")
        await settle(pilot)
        second = app.chat_screen.transcript.answers()[1]
        assert second.status in ("answered", "length", "turn_limit")
        statuses = [m.status for m in app.store.load(app.chat_screen.chat_id).messages
                    if m.role == "assistant"]
        assert statuses == ["cancelled", second.status]
        # free-form mode was used: the generated reasoning is in the block
        assert any(isinstance(e, ev.ReasoningDone) for e in stored_events(app))


async def test_real_engine_mode_switch_reaches_the_agent(real_settings, photo):
    app = EdgeAgentApp(real_settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {photo}")
        await pilot.press("ctrl+r")
        await type_and_enter(pilot, "What is this?")
        await settle(pilot)
        await pilot.press("ctrl+r")  # free-form -> direct: the model alone, a plain chat
        assert "direct" in str(app.chat_screen.status.render())
        await type_and_enter(pilot, "And this?")
        await settle(pilot)
        await pilot.press("ctrl+r")  # direct -> SSR
        events = stored_events(app)
        modes = [e.mode for e in events if isinstance(e, ev.RunStarted)]
        assert modes == ["freeform", "direct"]
        assert any(isinstance(e, ev.ReasoningDone) for e in events)
        answers = app.chat_screen.transcript.answers()
        assert answers[1].status in ("answered", "length") and not answers[1].turns  # no turn blocks
        plain = [m for m in app.store.load(app.chat_screen.chat_id).messages if m.role == "assistant"][1]
        assert not any(isinstance(e, ev.RationaleScored | ev.ToolCalled) for e in plain.events)
        assert any(isinstance(e, ev.AnswerToken) for e in plain.events)
    assert Settings.load().mode == "ssr"


async def test_real_engine_with_prophet_shows_drafts(real_settings, tiny_models, photo):
    """SeProD on: the prophet model loads too; its drafts appear in the turn blocks with counts
    (seprod_adaptive false waits for every draft: the first question's are not ready in time)."""
    settings = real_settings.updated({"prophet": str(tiny_models["prophet"]),
                                      "prophet_mmproj": str(tiny_models["mmproj"]), "seprod": True,
                                      "answer_max_tokens": 12, "seprod_draft_len": 4,
                                      "seprod_adaptive": False})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.host.state == "ready", [n.message for n in app._notifications]
        assert "prophet" in str(app.chat_screen.status.render())
        await type_and_enter(pilot, f"/image {photo}")
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        verified = [e for e in stored_events(app) if isinstance(e, ev.DraftVerified)]
        assert verified, "the prophet drafted nothing"
        view = app.chat_screen.transcript.answers()[0]
        drafts = [d for t in view.turns.values() for d in t.query(".draft")]
        assert len(drafts) == len(verified)
        assert f"{verified[0].accepted}/{verified[0].drafted}" in str(drafts[0].render())
        # settings that need no reload reach the loaded engine's parts
        engine = app.host.engine
        app.change_settings({"seprod_tau": 0.5, "offline": False})
        assert app.host.engine is engine and engine.drafter.tau == 0.5 and engine.tools.offline is False
        app.change_settings({"offline": True})
        assert engine.tools.offline is True and engine.settings.seprod_tau == 0.5


async def test_a_reopened_chat_reads_its_photo_ahead_for_the_prophet(real_settings, tiny_models, photo):
    """SeProD on, a stored chat opened again (its context is restored, not read): the agent encodes
    its photo in the background, so the prophet's drafts decode that embedding instead of encoding
    the photo in the follow-up's way."""
    settings = real_settings.updated({"prophet": str(tiny_models["prophet"]),
                                      "prophet_mmproj": str(tiny_models["mmproj"]), "seprod": True,
                                      "seprod_adaptive": False})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.host.state == "ready" and app.host.drafting
        await type_and_enter(pilot, f"/image {photo}")
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        chat_id = app.chat_screen.chat_id
        vision.clear_cache()  # as after a restart: no embedding of the photo in memory
        agent, prophet = app.host.engine.model, app.host.engine.prophet
        a0, p0 = agent.vision_encodes, prophet.vision_encodes
        await app.chat_screen.open_chat(app.store.load(chat_id))
        await pilot_wait_until(pilot, lambda: agent.vision_encodes == a0 + 1, what="the photo read ahead")
        await type_and_enter(pilot, "And what colour is it?")
        await settle(pilot)
        assert prophet.vision_encodes == p0  # the prophet drafted from the agent's embedding
        assert any(isinstance(e, ev.DraftVerified) for e in stored_events(app)[-40:])


async def test_real_text_only_model_refuses_an_image_with_a_titled_error(
    edge_home, tiny_models, photo, tmp_path):
    import shutil

    alone = tmp_path / "text-only"  # no mmproj beside it: loaded as a text-only model
    alone.mkdir()
    model = shutil.copy(tiny_models["text"], alone / "tiny.gguf")
    settings = Settings.load({"model": str(model), "offline": True, "n_threads": 1,
                              "n_threads_batch": 1, "n_ctx": 2048, "answer_max_tokens": 4, "max_turns": 1})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "(text only)" in str(app.chat_screen.status.render())
        # refused at once (issue 23 item 15), not at the question
        await type_and_enter(pilot, f"/image {photo}")
        assert any(n.title == "Model cannot see images" for n in app._notifications)
        assert app.chat_screen.image is None and app.store.list_chats() == []
        await type_and_enter(pilot, "Hello?")  # no image: the model answers
        await settle(pilot)
        assert app.chat_screen.transcript.answers()[0].status in ("answered", "length", "turn_limit")


async def test_first_run_screen_then_choosing_local_files_loads_them(edge_home, tmp_path, tiny_models):
    """A missing model file opens the first-run screen with the loader's fix; a pair the loader rejects
    (swapped: the mmproj as the model) is shown with its reason and never saved (the next start would
    open on the same error: issue 23 item 6); typing the right GGUF + mmproj there loads them (real
    llama.cpp), opens the chat and saves the choice."""
    from edge_agent.ui.screens.first_run import FirstRunScreen

    settings = Settings.load({"model": str(tmp_path / "nope.gguf"), "n_threads": 1, "n_threads_batch": 1,
                              "n_ctx": 2048, "offline": True})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen)
        assert "nope.gguf" in app.screen.problem and app.screen.problem_title == "Model file problem"
        app.screen.query_one("#model-path").value = str(tiny_models["mmproj"])
        app.screen.query_one("#mmproj-path").value = str(tiny_models["text"])
        await pilot.click("#use-files")
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen) and app.host.state == "no model"
        assert "tiny-qwen3vl-mmproj-f32.gguf" in app.screen.problem
        assert Settings.load().model != str(tiny_models["mmproj"])  # the rejected pair is not saved
        app.screen.query_one("#model-path").value = str(tiny_models["text"])
        app.screen.query_one("#mmproj-path").value = str(tiny_models["mmproj"])
        await pilot.click("#use-files")
        await settle(pilot)
        assert not isinstance(app.screen, FirstRunScreen)
        assert app.host.state == "ready" and app.host.sees_images
    saved = Settings.load()
    assert (saved.model, saved.mmproj) == (str(tiny_models["text"]), str(tiny_models["mmproj"]))


async def test_a_cut_answer_says_so_in_the_app(real_settings):
    """An answer stopped at answer_max_tokens does not look finished: its footer says it was cut, at how
    many tokens, and which setting raises it (issue 30 item 4)."""
    settings = real_settings.updated({"answer_max_tokens": 2, "max_turns": 1, "mode": "freeform"})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "Explain in detail how a bicycle works, step by step.")
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "length"
        footer = str(view.query_one(".answer-footer", Static).render())
        assert "cut off at 2 tokens (answer_max_tokens)" in footer and "Ctrl+S" in footer
        stored = [m for m in app.store.load(app.chat_screen.chat_id).messages if m.role == "assistant"]
        assert stored[0].status == "length"


async def test_a_photo_deleted_after_attaching_is_asked_about_as_it_was_read(real_settings, tmp_path):
    """The photo was read on attach: deleting the file before the question does not lose it (issue 30 item
    9)."""
    photo = make_image(tmp_path / "gone.png", (96, 64))
    app = EdgeAgentApp(real_settings.updated({"max_turns": 1}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {photo}")
        await pilot_wait_until(pilot, lambda: app.host.engine.read_ahead_idle(0.01),
                               what="the photo read ahead")
        photo.unlink()
        await type_and_enter(pilot, "What colour is it?")
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        assert view.status in ("answered", "length", "turn_limit"), (view.status, view.detail)
        assert any(isinstance(e, ev.ImageEvaluated) and e.source == "image" for e in stored_events(app))
