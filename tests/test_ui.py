"""Pilot tests of the app's behaviour with a scripted engine (pure UI logic: rendering, persistence,
cancellation, settings). The same paths with the real engine on tiny models: tests/test_ui_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import Input, Markdown, Static

from edge_agent.agent import events as ev
from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError, ModelRuntimeError
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.screens.chats import ChatsScreen
from edge_agent.ui.screens.first_run import FirstRunScreen
from edge_agent.ui.screens.settings import SettingsScreen
from edge_agent.ui.widgets.preview import half_blocks, looks_like_image_path, open_image, with_box
from edge_agent.ui.widgets.prompt import AttachmentBar, PromptInput, parse_slash
from edge_agent.ui.widgets.reasoning import TurnView
from edge_agent.ui.widgets.tool_view import ToolView
from tests.fakes.engines import ScriptedEngine
from tests.files import make_image
from tests.pilot import scripted_app, settle, type_and_enter
from tests.waits import pilot_wait_until

SIZE = (120, 40)


# --- pure helpers -----------------------------------------------------------------------------------

def test_parse_slash_and_pasted_paths(tmp_path, image):
    assert parse_slash("/image ~/a b.png") == parse_slash("/image   ~/a b.png")
    assert parse_slash("/image '/x/my photo.png'").arg == "/x/my photo.png"
    assert parse_slash("/home/me/a.png") is None  # a path, not a command
    assert parse_slash("what is this?") is None
    assert looks_like_image_path(f"'{image}'") == image
    assert looks_like_image_path(f"file://{image}") == image
    assert looks_like_image_path(str(tmp_path / "missing.png")) is None
    assert looks_like_image_path("what is in photo.png?") is None


def test_half_blocks_size_and_colors(image):
    """The cell picture (textual-image's half-cell renderer) fits the box, keeps the aspect ratio, and
    shows the image's own colours."""
    from rich.color import Color
    from rich.console import Console

    img = open_image(image)  # 96x64
    lines = Console(width=80, color_system="truecolor").render_lines(half_blocks(img, 24, 8), pad=False)
    cells = [[seg for seg in line if seg.text] for line in lines if any(seg.text for seg in line)]
    assert len(cells) == 8 and {sum(len(seg.text) for seg in row) for row in cells} == {24}
    first = cells[0][0]
    # its red
    assert first.text == "▀" and first.style.color == first.style.bgcolor == Color.from_rgb(200, 60, 40)
    boxed = with_box(img, [0, 0, 500, 500])
    assert boxed.getpixel((0, 0)) == (255, 220, 0) and img.getpixel((0, 0)) == (200, 60, 40)


def test_rationale_bars_mark_the_chosen_one():
    """Six rows, one bar each sized by p, the chosen row marked with ▶ and its percentage."""
    from rich.console import Console

    from edge_agent.ui.widgets.reasoning import bar, rationale_table
    from tests.fakes.engines import candidates

    e = ev.RationaleScored(turn=1, candidates=candidates([0.05, 0.10, 0.55, 0.05, 0.20, 0.05], 2), chosen=2,
                           seconds=0.061)
    console = Console(width=140, record=True, color_system=None)
    console.print(rationale_table(e))
    lines = console.export_text().splitlines()
    assert "6 rationales scored in one pass, 61 ms" in lines[0]
    rows = lines[1:]
    assert len(rows) == 6
    marked = [r for r in rows if r.lstrip().startswith("▶")]
    assert len(marked) == 1 and "55%" in marked[0] and "zoom" in marked[0]
    assert bar(1.0).plain == "█" * 12 and bar(0.0).plain.strip() == ""
    assert len(bar(0.55).plain.rstrip()) == 7  # 0.55 * 12 = 6.6 cells: 6 full + a partial


def test_open_image_rejects_a_non_image(tmp_path):
    bad = tmp_path / "fake.png"
    bad.write_text("not an image")
    with pytest.raises(Exception) as e:
        open_image(bad)
    assert "not an image" in e.value.message


# --- the app ----------------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_attach_ask_and_see_reasoning(settings, tmp_path, image):
    """/image attaches; the answer streams into Markdown; each turn is a block with the rationale bars,
    the zoom crop, the search badge and the prophet's accepted tokens; everything is in the store."""
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.host.state == "ready"
        await type_and_enter(pilot, f"/image {image}")
        assert app.chat_screen.image == str(image.resolve())
        await settle(pilot)
        assert engines[0].read[-1] == ("", str(image.resolve()), "")  # read ahead while the question is typed
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        assert engines[0].asked == [("What does the sign say?", str(image.resolve()), "ssr")]
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "answered"
        assert "OPEN" in view.query_one(Markdown).source
        assert sorted(view.turns) == [1, 2, 3]
        assert all(t.collapsed for t in view.turns.values())  # collapsed when done
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not any(t.collapsed for t in view.turns.values())
        turn1 = view.turns[1]
        assert len(turn1.query(".rationales")) == 1
        tool = turn1.query_one(ToolView)
        assert tool.finished.status == "local"
        assert len(tool.query(".zoom-crop")) == 1 and len(tool.query(".zoom-original")) == 1
        assert view.turns[2].query_one(ToolView).finished.status == "cached"
        assert len(view.turns[2].query(".draft")) == 1
        assert view.prophet_tokens == 1
        assert "3 turns" in str(view.query_one(".answer-footer", Static).render())
        # persisted: the chat resumes with the same events
        chat = app.store.load(app.chat_screen.chat_id)
        assert [m.role for m in chat.messages] == ["user", "assistant"]
        assert chat.messages[1].status == "answered"
        assert sum(isinstance(e, ev.RationaleScored) for e in chat.messages[1].events) == 3


@pytest.mark.asyncio
async def test_follow_up_continues_the_chats_kept_context(settings, tmp_path, image):
    """A follow-up passes the context key its chat's last answer was saved under; the answer shows how
    its context was opened and what the image cost, and the status bar says the context was kept."""
    app, engines = scripted_app(settings, tmp_path, contexts=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        await type_and_enter(pilot, "And the door?")
        await settle(pilot)
        assert engines[0].contexts == ["", "ctx:What does the sign say?"]
        first, second = app.chat_screen.transcript.answers()
        assert "image: 576 tokens" in str(first.query_one(".context-note", Static).render())
        note = str(second.query_one(".context-note", Static).render())
        assert "continued in memory" in note and "1,600 tokens kept" in note and "24 read" in note
        assert "context kept" in str(app.chat_screen.status.render())
        # a chat reopened later continues from the same saved context
        await pilot.press("ctrl+n")
        await settle(pilot)
        await app.chat_screen.open_chat(app.store.load(app.store.list_chats()[-1].id))
        await settle(pilot)
        await type_and_enter(pilot, "Anything else?")
        await settle(pilot)
        assert engines[0].contexts[-1] == "ctx:And the door?"


@pytest.mark.asyncio
async def test_attach_typing_and_detach_are_read_ahead(settings, tmp_path, image):
    """Issue 19's hooks: attaching an image, each change of the prompt and detaching tell the engine what
    the next question will be (image, words typed, the chat it continues); a command or a path is not
    read as a question; the follow-up's read-ahead continues from the first answer's context."""
    app, engines = scripted_app(settings, tmp_path, contexts=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        engine = engines[0]
        await type_and_enter(pilot, f"/image {image}")
        img = str(image.resolve())
        assert (("", img, "") in engine.read) and not any(t.startswith("/") for t, _, _ in engine.read)
        for ch in "Why":
            await pilot.press(ch)
        assert engine.read[-1] == ("Why", img, "")
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("ctrl+d")
        assert engine.read[-1] == ("", None, "ctx:Why")  # detached: the next question goes without it
        await pilot.press("O", "k")
        assert engine.read[-1] == ("Ok", None, "ctx:Why")


@pytest.mark.asyncio
async def test_escape_cancels_and_chat_stays_usable(settings, tmp_path, image):
    """Esc during a running answer marks it cancelled at once; the engine sees the cancel; the next
    question runs normally."""
    app, engines = scripted_app(settings, tmp_path, hold=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, str(image))  # a pasted path attaches
        await type_and_enter(pilot, "first question")
        answers = app.chat_screen.transcript.answers
        await pilot_wait_until(pilot, lambda: answers() and answers()[0].status == "running",
                               what="the answer to run")
        view = answers()[0]
        assert app.chat_screen.running is not None
        await pilot_wait_until(pilot, lambda: "writing the zoom action" in str(view._footer.render()))
        await pilot.press("escape")
        await pilot.pause()
        assert view.status == "cancelled" and app.chat_screen.running is None
        await settle(pilot)
        assert not app.host.lock.locked()  # the held answer saw the cancel and let go of the engine
        engines[0].hold = False
        await type_and_enter(pilot, "second question")
        await settle(pilot)
        second = app.chat_screen.transcript.answers()[1]
        assert second.status == "answered"
        chat = app.store.load(app.chat_screen.chat_id)
        assert [m.status for m in chat.messages if m.role == "assistant"] == ["cancelled", "answered"]


@pytest.mark.asyncio
async def test_switch_mode_is_used_and_persisted(settings, tmp_path, image, edge_home):
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.settings.mode == "freeform"
        assert "free-form" in str(app.chat_screen.status.render())
        await type_and_enter(pilot, "question")
        await settle(pilot)
        assert engines[0].asked[-1][2] == "freeform"
        await type_and_enter(pilot, "/mode ssr")
        assert app.settings.mode == "ssr"
        await type_and_enter(pilot, "/offline on")
    saved = Settings.load()
    assert saved.offline is True and saved.mode == "ssr"
    assert "offline = true" in (edge_home / "config.toml").read_text()


@pytest.mark.asyncio
async def test_settings_screen_saves_and_rejects_bad_values(settings, tmp_path, edge_home):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#f-ssr_tau").value = "-1"
        screen.action_save()
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)  # refused, with a notification
        assert any("ssr_tau" in n.message for n in app._notifications)
        screen.query_one("#f-ssr_tau").value = "0.5"
        screen.query_one("#f-max_turns").value = "3"
        screen.query_one("#f-seprod").value = False
        screen.query_one("#f-crop_max_tokens").value = "128"  # a cheaper zoom on a slow machine
        screen.action_save()
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert (app.settings.ssr_tau, app.settings.max_turns, app.settings.seprod,
                app.settings.crop_max_tokens) == (0.5, 3, False, 128)
    saved = Settings.load()
    assert (saved.ssr_tau, saved.max_turns, saved.seprod, saved.crop_max_tokens) == (0.5, 3, False, 128)


@pytest.mark.asyncio
async def test_settings_screen_says_how_to_save_and_enter_saves(settings, tmp_path, edge_home):
    """The screen says that Ctrl+S saves; Enter in a field saves too (issue 30 item 9)."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        title = str(screen.query_one("#settings-title", Static).render())
        assert "Ctrl+S" in title and "Enter" in title and "Esc" in title
        field = screen.query_one("#f-max_turns", Input)
        field.focus()
        field.value = "4"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen) and app.settings.max_turns == 4
    assert Settings.load().max_turns == 4


@pytest.mark.asyncio
async def test_export_chat_writes_markdown_json_and_crops(settings, tmp_path, image):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        out = tmp_path / "exports"
        await type_and_enter(pilot, f"/export {out}")
    md = next(out.glob("*.md")).read_text()
    data = json.loads(next(out.glob("*.json")).read_text())
    assert "image_zoom_in_tool" in md and "![crop](" in md and "| **>** |" in md
    assert data["messages"][0]["image"] == str(image.resolve())
    assert any(e["event"] == "rationale_scored" for e in data["messages"][1]["events"])
    assert len(list(out.glob("*_files/*"))) == 2  # the photo and the crop


@pytest.mark.asyncio
async def test_chat_list_resume_rename_delete(settings, tmp_path, image):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await type_and_enter(pilot, "first chat question")
        await settle(pilot)
        first = app.chat_screen.chat_id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.chat_screen.chat_id is None and not app.chat_screen.transcript.answers()
        await type_and_enter(pilot, "second chat question")
        await settle(pilot)
        second = app.chat_screen.chat_id
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ChatsScreen)
        assert [c.id for c in app.screen.chats] == [second, first]
        await pilot.press("down", "r")
        await pilot.pause()
        rename = app.screen.query_one("#new-title")
        rename.value = "Renamed chat"
        await pilot.press("enter")
        await pilot.pause()
        assert app.store.load(first).title == "Renamed chat"
        await pilot.press("enter")  # resume the highlighted (first) chat
        await pilot.pause()
        await settle(pilot)
        assert app.chat_screen.chat_id == first
        assert app.chat_screen.image == str(image.resolve())
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "answered" and "OPEN" in view.query_one(Markdown).source
        assert sorted(view.turns) == [1, 2, 3]
        await pilot.press("ctrl+o")
        await pilot.pause()
        # delete the other chat (newest first: highlighted); d asks, d again deletes
        await pilot.press("d", "d")
        await pilot.pause()
        assert [c.id for c in app.screen.chats] == [first]
        await pilot.press("escape")


@pytest.mark.asyncio
async def test_bad_image_and_engine_error_are_notifications(settings, tmp_path):
    """A non-image file and an engine error show titled notifications; the app keeps running."""
    bad = tmp_path / "bad.png"
    bad.write_text("nope")

    def failing(asked):
        yield ev.RunStarted(question="q", image=None, mode="ssr", seprod=False, model="m")
        raise ModelRuntimeError("Context is full (8192 tokens). Start a new chat or raise n_ctx.")

    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, script=failing))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {bad}")
        assert app.chat_screen.image is None
        assert any(n.title == "Image problem" for n in app._notifications)
        await type_and_enter(pilot, "question")
        await settle(pilot)
        assert any(n.title == "Model error" and "n_ctx" in n.message for n in app._notifications)
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "error" and app.chat_screen.running is None
        # it failed before the model read anything: shown, but not written (chat.recorder), as in `ask`
        assert app.chat_screen.chat_id is None and app.store.list_chats() == []


@pytest.mark.asyncio
async def test_first_run_screen_then_demo_choice_reloads(settings, tmp_path):
    """No model: the first-run screen says how to get one; choosing the demo saves the setting and
    loads again (here successfully)."""
    calls: list[str] = []

    def factory(s, *, progress=None):
        calls.append(s.model)
        if not s.model:
            raise ModelFileError("No model is installed. Download one: `edge-agent models pull "
                                 "qwen3-vl-2b-instruct`",
                                 title="No model")
        return ScriptedEngine(s, tmp_path)

    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen)
        text = " ".join(str(w.render()) for w in app.screen.query(Static))
        assert "No model" in text
        # it offers a text-only demo, so it does not say a vision model is required (issue 30 item 9)
        welcome = str(app.screen.query_one("#welcome", Static).render())
        assert "needs a vision-language model" not in welcome and "text only" in welcome, welcome
        await pilot.click("#use-demo")
        await settle(pilot)
        assert calls == ["", "smollm2-135m-demo"]
        assert not isinstance(app.screen, FirstRunScreen) and app.host.state == "ready"
    assert Settings.load().model == "smollm2-135m-demo"


def held_load(tmp_path, progress_text: str | None = None):
    """An engine factory whose load waits for ``release`` (set it to finish loading): (factory, release,
    the engines it made)."""
    import threading

    release, made = threading.Event(), []

    def factory(s, *, progress=None):
        if progress_text is not None:
            progress(progress_text, 0.4)
        release.wait(30)
        made.append(ScriptedEngine(s, tmp_path))
        return made[-1]

    return factory, release, made


@pytest.mark.asyncio
async def test_loading_shows_progress_and_the_prompt_stays_usable(settings, tmp_path, image):
    """While the model loads, a progress line shows the loader's words; typing and attaching work; a
    question sent too early stays in the prompt with a notice, and goes once the model is ready."""
    factory, release, made = held_load(tmp_path, "Loading tiny-model")
    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        await pilot_wait_until(pilot, lambda: "Loading tiny-model" in str(
            screen.query_one("#loading-label", Static).render()),
                               what="the loading progress")
        assert screen.query_one("#loading").has_class("-visible")
        assert screen.query_one("#loading-bar").progress == pytest.approx(0.4)
        assert app.host.state == "loading"
        await type_and_enter(pilot, f"/image {image}")
        assert screen.image == str(image.resolve())
        await type_and_enter(pilot, "too early?")
        assert any(n.title == "Model loading" for n in app._notifications)
        assert screen.query_one(PromptInput).value == "too early?"  # kept until it can go
        release.set()
        await settle(pilot)
        assert app.host.state == "ready" and not screen.query_one("#loading").has_class("-visible")
        assert made[0].asked == [("too early?", str(image.resolve()), "ssr")]  # sent once the model was ready
        assert screen.query_one(PromptInput).value == ""


@pytest.mark.asyncio
@pytest.mark.parametrize("hold", ["edit", "escape"])
async def test_a_question_waiting_for_the_model_can_be_held_back(settings, tmp_path, hold):
    """A question sent while the model loads is not sent once it is ready when it was edited meanwhile, or
    held back with Esc: it stays in the prompt, to send with Enter."""
    factory, release, made = held_load(tmp_path)
    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_wait_until(pilot, lambda: app.host.state == "loading", what="the load to start")
        await type_and_enter(pilot, "too early?")
        if hold == "edit":
            await pilot.press("backspace")
        else:
            await pilot.press("escape")
            assert any(n.title == "Question not sent" for n in app._notifications)
        release.set()
        await settle(pilot)
        assert app.host.state == "ready" and made[0].asked == []
        kept = "too early" if hold == "edit" else "too early?"
        prompt = app.chat_screen.query_one(PromptInput)
        assert prompt.value == kept
        await pilot.press("enter")
        await settle(pilot)
        assert [q for q, _, _ in made[0].asked] == [kept] and prompt.value == ""


@pytest.mark.asyncio
async def test_settings_changed_while_the_model_loads_reach_the_loaded_engine(settings, tmp_path):
    """A setting the engine takes live (tau), changed while the model loads, is the loaded engine's
    setting once it is ready (the load started with the old one); the model loads once."""
    factory, release, made = held_load(tmp_path)
    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_wait_until(pilot, lambda: app.host.state == "loading", what="the load to start")
        app.change_settings({"ssr_tau": 0.25})
        release.set()
        await settle(pilot)
        assert app.host.state == "ready" and len(made) == 1
        assert made[0].settings.ssr_tau == 0.25


@pytest.mark.asyncio
async def test_engine_loads_in_a_worker_thread(settings, tmp_path):
    """The factory runs off the UI thread (the UI stays responsive while a model loads)."""
    import threading

    seen = {}

    def factory(s, *, progress=None):
        seen["thread"] = threading.current_thread()
        return ScriptedEngine(s, tmp_path)

    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert seen["thread"] is not threading.main_thread()


@pytest.mark.asyncio
async def test_killed_mid_answer_is_shown_as_interrupted_on_resume(settings, tmp_path, image):
    store = ChatStore(settings.chats_path)
    cid = store.new_chat()
    store.add_user_message(cid, "q", str(image))
    mid = store.start_answer(cid)
    store.add_event(mid, ev.TurnStarted(turn=1))
    store.add_event(mid, ev.AnswerToken(turn=1, text="Half an ans"))
    store.close()  # the 'running' row is what a killed app leaves behind
    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s), open_chat=cid)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "interrupted"
        assert view.query_one(Markdown).source == "Half an ans"
        assert isinstance(view.turns[1], TurnView)


def test_edge_agent_without_a_subcommand_opens_the_app(edge_home, monkeypatch):
    """`edge-agent` (no sub-command) runs the TUI with the loaded settings and CLI overrides."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    ran = []
    monkeypatch.setattr(EdgeAgentApp, "run", lambda self, *a, **k: ran.append(self))
    result = CliRunner().invoke(cli, [])
    assert result.exit_code == 0, result.output
    assert len(ran) == 1 and ran[0].settings.home == edge_home
    result = CliRunner().invoke(cli, ["tui", "--mode", "freeform", "--offline"])
    assert result.exit_code == 0, result.output
    assert ran[1].settings.mode == "freeform" and ran[1].settings.offline is True
    for app in ran:
        app.store.close()


@pytest.mark.asyncio
async def test_narrow_terminal_hides_the_image_panel(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        from edge_agent.ui.screens.chat import ImagePanel

        assert app.chat_screen.query_one(ImagePanel).display is False


@pytest.mark.asyncio
async def test_file_picker_offers_only_images_and_attaches_one(settings, tmp_path, image, monkeypatch):
    """Ctrl+F opens a tree of folders and image files (a .txt is not offered); Enter on the image
    attaches it; `/image 1` goes back to the first image of the chat after another was attached."""
    from edge_agent.ui.screens.picker import ImagePickerScreen, ImageTree

    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub").mkdir()
    other = make_image(tmp_path / "sub" / "other.png")
    monkeypatch.chdir(tmp_path)
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert isinstance(app.screen, ImagePickerScreen)
        tree = app.screen.query_one(ImageTree)

        def listed() -> list[str]:
            return sorted(Path(str(n.data.path)).name for n in tree.root.children)

        await pilot_wait_until(pilot, lambda: {"photo.png", "sub"} <= set(listed()), what="the tree to load")
        assert "notes.txt" not in listed()
        photo_node = next(n for n in tree.root.children if Path(str(n.data.path)).name == "photo.png")
        tree.move_cursor(photo_node)
        tree.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ImagePickerScreen)
        assert app.chat_screen.image == str(image.resolve())
        await type_and_enter(pilot, str(other))
        assert app.chat_screen.image == str(other.resolve())
        await type_and_enter(pilot, "/image 1")
        assert app.chat_screen.image == str(image.resolve())
        assert app.chat_screen.images == [str(image.resolve()), str(other.resolve())]


@pytest.mark.asyncio
async def test_graphics_previews_use_textual_image_when_enabled(settings, tmp_path, image, monkeypatch):
    """Where the terminal speaks a graphics protocol, previews are textual-image widgets (here its
    half-cell widget stands in for Kitty/Sixel, which a test terminal cannot show)."""
    from textual_image.widget import HalfcellImage

    from edge_agent.ui.widgets import preview

    monkeypatch.setattr(preview, "_GRAPHICS", HalfcellImage)
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await pilot.pause()
        current = app.chat_screen.query_one("#current-image", preview.ImagePreview)
        assert len(current.query(HalfcellImage)) == 1
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        assert len(app.chat_screen.transcript.query(HalfcellImage)) >= 3  # question thumb, original, crop


def test_only_the_ui_package_imports_textual():
    """The engine, agent, runtime, tools and chat store never import Textual (checked in a fresh
    interpreter and in the source)."""
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"^\s*(from|import)\s+textual", re.M)
    ui = root / "edge_agent" / "ui"
    sources = [*(root / "edge_agent").rglob("*.py"), *(root / "tools").rglob("*.py")]
    offenders = [str(p.relative_to(root)) for p in sources
                 if ui not in p.parents and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
    code = ("import sys, edge_agent.chat.store, edge_agent.engine.engine, edge_agent.commands.cli; "
            "print(any(m == 'textual' or m.startswith('textual.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.asyncio
async def test_changing_the_model_closes_the_old_engine_and_loads_the_new(settings, tmp_path, edge_home):
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.change_settings({"model": "other-model.gguf"})
        assert app.host.engine is None and app.host.state == "loading"
        await settle(pilot)
        assert len(engines) == 2 and engines[0].closed and not engines[1].closed
        assert app.host.engine is engines[1] and engines[1].settings.model == "other-model.gguf"
    assert engines[1].closed  # closed at exit
    assert 'model = "other-model.gguf"' in (edge_home / "config.toml").read_text()


@pytest.mark.asyncio
async def test_prompt_history_walks_earlier_questions_across_restarts(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for q in ("first question", "second question"):
            await type_and_enter(pilot, q)
            await settle(pilot)
    app, _ = scripted_app(settings, tmp_path)  # a new session reads the history from the chat store
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        prompt.value = "draft"
        await pilot.press("up")
        assert prompt.value == "second question"
        await pilot.press("up", "up")
        assert prompt.value == "first question"
        await pilot.press("down", "down")
        assert prompt.value == "draft"  # back to what was being typed


def test_app_killed_mid_answer_keeps_the_streamed_events(edge_home, tmp_path):
    """The app process is SIGKILLed while an answer is running; the chat store already holds the
    question and the events so far, and the answer reads 'interrupted' when the chat is opened."""
    import os
    import select
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    child = """
import sqlite3, sys, time
from edge_agent.core.config import Settings
from edge_agent.ui.app import EdgeAgentApp
from tests.fakes.engines import ScriptedEngine

s = Settings.load()
app = EdgeAgentApp(s, engine_factory=lambda st, progress=None: ScriptedEngine(st, hold=True))

async def pilot(p):
    while app.host.engine is None:
        await p.pause(0.05)
    prompt = app.screen.query_one("#prompt")
    prompt.value = "a question before the crash"
    await p.press("enter")
    while True:  # wait until the engine's first events are on disk, then say so
        await p.pause(0.05)
        n = sqlite3.connect(s.chats_path).execute("SELECT COUNT(*) FROM events").fetchone()[0]
        if n >= 3:
            print("EVENTS", n, flush=True)
            time.sleep(60)

app.run(headless=True, size=(100, 30), auto_pilot=pilot)
"""
    env = {**os.environ, "EDGE_AGENT_HOME": str(edge_home), "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the app never stored the running answer's events"
        line = proc.stdout.readline()
        assert line.startswith("EVENTS"), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    store = ChatStore(Settings.load().chats_path)
    chat = store.load(store.list_chats()[0].id)
    assert chat.messages[0].text == "a question before the crash"
    answer = chat.messages[1]
    assert answer.status == "interrupted"
    assert [e.kind for e in answer.events][:3] == ["run_started", "turn_started", "rationale_scored"]
    store.close()


@pytest.mark.asyncio
async def test_help_stays_in_the_transcript(settings, tmp_path):
    """/help is a block in the transcript that stays (it was a toast that vanished; issue 30 item 9)."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "/help")
        await settle(pilot)
        app.clear_notifications()
        shown = [str(w.render()) for w in app.chat_screen.transcript.query(".help").results(Static)]
        assert shown and "/image PATH" in shown[-1] and "/mode ssr|freeform|direct" in shown[-1]
        assert "Ctrl+R" in shown[-1]  # the keys too


@pytest.mark.asyncio
async def test_at_80x24_the_status_bar_keeps_the_mode_and_seprod_and_hints_are_whole(settings, tmp_path):
    """A small terminal: the model names give way before the mode and SeProD do; the attachment hint
    wraps instead of being cut (issue 30 item 9)."""
    app, _ = scripted_app(settings.updated({"seprod": True}), tmp_path, vision=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        bar = app.chat_screen.status
        bar.set_models("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct", text_only=True)
        bar.tokens_per_second, bar.context, bar.network_down = 12.3, "context restored", True
        await pilot.pause()
        shown = str(bar.render())
        assert "SSR" in shown and "SeProD" in shown and "ready" in shown and "no network" in shown, shown
        assert shown.startswith("qwen2.5")  # the model's name is cut short, not dropped
        hint = app.chat_screen.query_one(AttachmentBar)
        assert hint.size.height >= 2 and "vision model" in str(hint.render())


@pytest.mark.asyncio
async def test_a_sure_answer_check_is_shown_in_its_turn(settings):
    """SSR's answer check that lets an answer from what the model knows stand is shown in the turn (an unsure
    one shows as the answer taken back), with the model's words and the score against the threshold."""
    cand = ev.RationaleCandidate("answer_knowledge", "I know this", "answer", -1.0, -8.0, 8, 1.0)

    def script(asked):
        yield ev.RunStarted(question="q", image=None, mode="ssr", seprod=False, model="m")
        yield ev.TurnStarted(turn=1)
        yield ev.RationaleScored(turn=1, candidates=(cand,), chosen=0, seconds=0.01, score_kind="pmi")
        yield ev.AnswerChecked(turn=1, pieces=("17", " times", " 23", " is", " 391", ".</"),
                               logprobs=(-0.1,) * 6, score=-0.06, threshold=-0.2, sure=True)
        yield ev.AnswerToken(turn=1, text="17 times 23 is 391.")
        yield ev.TurnFinished(turn=1, action="answer", reasoning_seconds=0.01, action_seconds=0.1,
                              tool_seconds=0.0)
        yield ev.FinalAnswer(answer="17 times 23 is 391.", turns=1, stop_reason="answered")

    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, script=script))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "What is 17 times 23?")
        await settle(pilot)
        turn = app.chat_screen.transcript.answers()[0].turns[1]
        text = " ".join(str(w.render()) for w in turn.query(Static))
        assert "answer check: sure ('17 times 23 is 391.'...: mean log-prob -0.06" in text, text


@pytest.mark.asyncio
async def test_a_move_taken_back_is_shown_in_its_turn(settings):
    """The turn shows the search that was taken back (nothing new) and the second choice's scores."""
    cand = [ev.RationaleCandidate("text_search", "I should search the web for facts", "text_search", -1.0,
                                  -8.0, 8, 0.7),
            ev.RationaleCandidate("answer_evidence", "I should answer from the evidence", "answer", -2.0,
                                  -12.0, 6, 0.3)]

    def script(asked):
        yield ev.RunStarted(question="q", image=None, mode="ssr", seprod=False, model="m")
        yield ev.TurnStarted(turn=1)
        yield ev.RationaleScored(turn=1, candidates=tuple(cand), chosen=0, seconds=0.01, score_kind="pmi")
        yield ev.MoveWithdrawn(turn=1, action="text_search", arguments={"query": "capital of Peru"},
                               reason='this question already searched for "capital of peru" (its results are '
                                      'above)')
        yield ev.RationaleScored(turn=1, candidates=(cand[1],), chosen=0, seconds=0.0, score_kind="pmi",
                                 rechosen=True)
        yield ev.AnswerToken(turn=1, text="Lima")
        yield ev.TurnFinished(turn=1, action="answer", reasoning_seconds=0.01, action_seconds=0.1,
                              tool_seconds=0.0)
        yield ev.FinalAnswer(answer="Lima", turns=1, stop_reason="answered")

    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, script=script))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "What is the capital of Peru?")
        await settle(pilot)
        turn = app.chat_screen.transcript.answers()[0].turns[1]
        text = " ".join(str(w.render()) for w in turn.query(Static))
        assert "text_search 'capital of Peru' taken back: this question already searched" in text
        assert len(turn.query(".rationales")) == 2  # the scores, then the choice among the rest
    from rich.console import Console

    from edge_agent.ui.widgets.reasoning import rationale_table

    console = Console(width=140, record=True, color_system=None)
    console.print(rationale_table(ev.RationaleScored(turn=1, candidates=(cand[1],), chosen=0, seconds=0.0,
                                                     score_kind="pmi", rechosen=True, why="its answer is "
                                                     "checked before a first search")))
    head = console.export_text().splitlines()[0]
    assert "the best of 1 answer rationale, from the same scores: its answer is checked before" in head
    console = Console(width=140, record=True, color_system=None)
    console.print(rationale_table(ev.RationaleScored(turn=1, candidates=(cand[1],), chosen=0, seconds=0.0,
                                                     score_kind="pmi", rechosen=True)))
    head = console.export_text().splitlines()[0]
    assert "SSR: the one other rationale, from the same scores (calibrated" in head  # not "other 1 ..."


@pytest.mark.asyncio
async def test_an_answer_taken_back_after_it_streamed_is_cleared(settings):
    """A looping answer before any tool result is taken back after its tokens streamed (the agent then
    searches): the transcript clears it, and the stored answer text is not it."""
    from edge_agent.chat.store import answer_text

    events = [ev.RunStarted(question="q", image=None, mode="ssr", seprod=False, model="m"),
              ev.TurnStarted(turn=1),
              *(ev.AnswerToken(turn=1, text=" Nana") for _ in range(8)),
              ev.MoveWithdrawn(turn=1, action="answer", arguments={},
                               reason="the answer began repeating itself ('Nana Nana ...'): the model "
                                      "does not know; it searches first"),
              ev.AgentError(turn=1, title="Search failed", message="down", fatal=True)]

    def script(asked):
        yield from events

    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, script=script))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "What is Ghana's anthem?")
        await settle(pilot)
        answer = app.chat_screen.transcript.answers()[0]
        assert "Nana" not in answer.text
        text = " ".join(str(w.render()) for w in answer.turns[1].query(Static))
        assert "answer taken back: the answer began repeating itself" in text, text
    assert answer_text(events) == ""
