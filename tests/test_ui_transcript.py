"""The chat's transcript under Pilot: /retry and /edit that really replace, a busy app that leaves the prompt
alone, a first-run screen that saves only what loaded, a long chat that opens at its end, model text
that stays readable, and the small things (first-run focus, Ctrl+T for every answer, a 60-column
status bar, /image on a text-only model).

The replacing test runs the real llama.cpp on the tiny Qwen3-VL GGUFs; the rest
drive pure UI logic with the scripted engine of tests/fakes/engines.py.
"""

from __future__ import annotations

import sqlite3

import pytest
from textual.widgets import Input, Markdown, Static
from textual.widgets._collapsible import CollapsibleTitle
from textual.widgets._markdown import MarkdownBlockQuote, MarkdownHeader, MarkdownParagraph

from edge_agent.agent import events as ev
from edge_agent.chat import export as chat_export
from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.screens.first_run import FirstRunScreen
from edge_agent.ui.widgets.prompt import PromptInput
from edge_agent.ui.widgets.readable import readable_markdown
from edge_agent.ui.widgets.statusbar import StatusBar
from edge_agent.ui.widgets.transcript import AnswerView, UserMessage
from tests.fakes.engines import Asked
from tests.files import long_chat
from tests.pilot import scripted_app, settle, type_and_enter
from tests.waits import pilot_wait_until

SIZE = (130, 40)


def titles(app) -> list[str]:
    return [n.title for n in app._notifications]


# --- item 1: /retry and /edit replace the last exchange ------------------------------------------------
@pytest.fixture
def real_settings(edge_home, tiny_models) -> Settings:
    return Settings.load({
        "model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
        "offline": True, "n_threads": 1, "n_threads_batch": 1, "n_ctx": 4096,
        "answer_max_tokens": 6, "max_turns": 2,
    })


def answers(store: ChatStore, chat_id: int) -> list[list[ev.Event]]:
    """The events of each answer of the chat, replaced ones included, in order."""
    return [m.events for m in store.load(chat_id).messages if m.role == "assistant"]


def first(events: list[ev.Event], kind: type) -> ev.Event:
    return next(e for e in events if isinstance(e, kind))


@pytest.mark.asyncio
async def test_retry_and_edit_continue_from_the_chats_visible_exchanges(real_settings):
    """Q one, Q two, /edit Q two -> "Q two? edited", /retry, /retry, Q three: every replacement starts
    from the context after Q one's answer (as the first Q two did), and Q three continues exactly the
    context a chat of only the visible exchanges (Q one, Q two? edited, Q three) continues: the same
    tokens (the same saved-context key) and the same rationale scores. The replaced exchanges stay in
    the chat, marked, and are not its continuation."""
    app = EdgeAgentApp(real_settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.host.state == "ready", titles(app)
        for step in ("Q one?", "Q two?", "/edit", ", edited", "/retry", "/retry", "Q three?"):
            if step.startswith(","):  # /edit put "Q two?" in the prompt: change it and send it
                prompt = app.screen.query_one(PromptInput)
                assert prompt.value == "Q two?"
                await pilot.press(*step, "enter")
                await pilot.pause()
            else:
                await type_and_enter(pilot, step)
            await settle(pilot)
        edited = app.chat_screen.chat_id
        live = app.chat_screen.transcript
        live_marks = [w.has_class("-replaced") for w in live.query(UserMessage)]
        live_marks += [v.has_class("-replaced") for v in live.query(AnswerView)]
        await pilot.press("ctrl+n")
        for q in ("Q one?", "Q two?, edited", "Q three?"):
            await type_and_enter(pilot, q)
            await settle(pilot)
        visible = app.chat_screen.chat_id
        store = app.store
        a, b = answers(store, edited), answers(store, visible)
        assert len(a) == 6 and len(b) == 3
        after_q1 = first(a[1], ev.ContextOpened).tokens_reused  # what the first Q two continued
        assert after_q1 > 0
        for replacement in a[2:5]:  # the edit and the two retries
            opened = first(replacement, ev.ContextOpened)
            assert (opened.source, opened.tokens_reused) == ("live", after_q1)
        assert first(a[5], ev.ContextOpened).tokens_reused == first(b[2], ev.ContextOpened).tokens_reused
        assert first(a[5], ev.FinalAnswer).context == first(b[2], ev.FinalAnswer).context  # the same tokens
        scores_a = [c.score for e in a[5] if isinstance(e, ev.RationaleScored) for c in e.candidates]
        scores_b = [c.score for e in b[2] if isinstance(e, ev.RationaleScored) for c in e.candidates]
        assert scores_a and scores_a == pytest.approx(scores_b, abs=1e-5)
        cont = store.continuation(edited)
        assert [q for q, _, _ in cont.exchanges] == ["Q one?", "Q two?, edited", "Q three?"]
        messages = store.load(edited).messages
        assert [m.replaced for m in messages if m.role == "user"] == [False, True, True, True, False, False]
        marks = [False, True, True, True, False, False]
        assert live_marks == marks + marks  # questions, then answers
        shown = app.chat_screen.transcript
        await app.chat_screen.open_chat(store.load(edited))  # its last page: the last four exchanges
        await pilot.pause()
        assert [w.has_class("-replaced") for w in shown.query(UserMessage)] == marks[-4:]
        footers = [str(v.query_one(".answer-footer", Static).render()) for v in shown.query(AnswerView)]
        assert ["replaced by a later answer" in f for f in footers] == marks[-4:]


def test_replaced_exchanges_are_not_the_chats_continuation(edge_home, tmp_path):
    """The store: a question sent with ``replace_last`` marks the last exchange replaced; continuation,
    history and the last question skip it; the export says so; a schema-3 file gains the column."""
    store = ChatStore(tmp_path / "chats.sqlite3")
    cid = store.new_chat()
    for q, a, key in (("one", "A1", "k1"), ("two", "A2", "k2"), ("two!", "A2!", "k3")):
        store.add_user_message(cid, q, None, replace_last=q == "two!")
        mid = store.start_answer(cid)
        store.add_event(mid,
                        ev.FinalAnswer(answer=a, turns=1, stop_reason="answered", totals={}, context=key))
    cont = store.continuation(cid)
    assert [(q, c) for q, _, c in cont.exchanges] == [("one", "k1"), ("two!", "k3")] and cont.context == "k3"
    assert [h["question"] for h in store.history(cid)] == ["one", "two!"]
    assert store.last_question(cid) == ("two!", [])
    md = chat_export.export_markdown(store, cid)
    assert md.count("replaced by a later answer") == 1
    store.close()
    db = sqlite3.connect(tmp_path / "chats.sqlite3")  # as a version-3 file (before replaced) was
    db.executescript("ALTER TABLE messages DROP COLUMN replaced; ALTER TABLE messages DROP COLUMN images; "
                     "PRAGMA user_version=3;")
    db.close()
    store = ChatStore(tmp_path / "chats.sqlite3")
    # nothing was marked
    assert [q for q, _, _ in store.continuation(cid).exchanges] == ["one", "two", "two!"]
    store.add_user_message(cid, "two?", None, replace_last=True)
    assert [q for q, _, _ in store.continuation(cid).exchanges] == ["one", "two"]
    store.close()


# --- item 2: /retry while an answer runs --------------------------------------------------------------
@pytest.mark.asyncio
async def test_retry_while_an_answer_runs_says_busy_and_leaves_the_prompt(settings, tmp_path):
    """/retry (and /edit) during a running answer: a "Busy" notice, the prompt exactly as it was (text
    and cursor), nothing sent, nothing stored."""
    app, engines = scripted_app(settings, tmp_path, hold=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "First question?")
        view = app.chat_screen.transcript.answers()[0]
        await pilot_wait_until(pilot, lambda: "writing the zoom action" in str(view._footer.render()))
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        for command in ("/retry", "/edit"):
            before = len(app._notifications)
            prompt.value = ""
            await pilot.press(*command)
            assert (prompt.value, prompt.cursor_position) == (command, len(command))
            await pilot.press("enter")
            await pilot.pause()
            assert "Busy" in titles(app)[before:]
            assert (prompt.value, prompt.cursor_position) == (command, len(command))
        await pilot.press(*"X")
        assert prompt.value == "/editX"  # typing goes on where it was
        assert [a[0] for a in engines[0].asked] == ["First question?"]
        assert [m.text for m in app.store.load(app.chat_screen.chat_id).messages if m.role == "user"] == [
            "First question?"]
        await pilot.press("escape")
        await settle(pilot)


# --- item 6: the first-run screen saves only a pair that loaded: tests/test_ui_real.py
# (test_first_run_screen_then_choosing_local_files_loads_them, with a pair the real loader rejects)


# --- item 7: a long chat opens at its end; Home loads older messages; resizing keeps the end ----------
@pytest.mark.asyncio
async def test_a_long_chat_opens_at_its_end_home_loads_more_and_resizing_keeps_the_end(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.chat_screen.open_chat(app.store.load(long_chat(app.store, 30)))
        tr = app.chat_screen.transcript

        def last_answer_in_view() -> bool:
            last = tr.query(AnswerView).last()
            return (tr.is_vertical_scroll_end and tr.max_scroll_y > 0
                    and last.region.bottom <= tr.region.bottom)

        await pilot_wait_until(pilot, last_answer_in_view, what="the last answer in view")
        for size in ((80, 24), (60, 20), (130, 40)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            await pilot_wait_until(pilot, last_answer_in_view, what=f"the end in view at {size}")
        shown = len(tr.query(UserMessage))
        tr.focus()
        for _ in range(2):  # the first Home goes to the top, the second asks for the earlier messages
            await pilot.press("home")
            await pilot.pause()
        await pilot_wait_until(pilot, lambda: len(tr.query(UserMessage)) > shown, what="Home to load more")


@pytest.mark.asyncio
async def test_answers_that_close_their_turns_keep_the_end_in_view(settings, tmp_path):
    """Each answer closes its reasoning blocks when done: the transcript stays at its end (a closing
    block does not scroll itself into view)."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        tr = app.chat_screen.transcript
        for q in ("one?", "two?", "three?"):
            await type_and_enter(pilot, q)
            await settle(pilot)
            await pilot.pause(0.2)  # the blocks' own scrolling runs after a refresh
            assert tr.is_vertical_scroll_end, (q, tr.scroll_y, tr.max_scroll_y)
        assert tr.max_scroll_y > 0


@pytest.mark.asyncio
async def test_only_a_persons_toggle_scrolls_a_turn_into_view(settings, tmp_path):
    """A collapsible scrolls itself into view when it opens or closes. A turn closed by the app (its answer
    done) or opened and closed with every other (Ctrl+T) must not: the scroll would release the transcript's
    anchor and the chat would stop following its end (the race behind a rare failure of the test above:
    the turn closed before the anchor had scrolled). A person's toggle of one turn still brings it into
    view."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        tr = app.chat_screen.transcript

        async def stays_at_end(what: str) -> None:
            for _ in range(5):
                await pilot.pause(0.05)
                assert tr.is_vertical_scroll_end, (what, tr.scroll_y, tr.max_scroll_y)

        for q in ("one?", "two?", "three?", "four?", "five?", "six?"):
            await type_and_enter(pilot, q)
            await settle(pilot)
        await pilot_wait_until(pilot, lambda: tr.is_vertical_scroll_end, what="the end in view")
        for what in ("Ctrl+T opens every turn", "Ctrl+T closes them"):
            await pilot.press("ctrl+t")
            await stays_at_end(what)
        turn = next(iter(tr.query(AnswerView).first().turns.values()))
        turn.query_one(CollapsibleTitle).action_toggle_collapsible()  # a person opens the first answer's turn
        await pilot_wait_until(pilot, lambda: not turn.collapsed and turn.region.overlaps(tr.region),
                               what="the opened turn scrolled into view")
        tr.scroll_end(animate=False, immediate=True)  # back to the end: anchored again
        await pilot_wait_until(pilot, lambda: tr.is_vertical_scroll_end, what="the end in view")
        await pilot_wait_until(pilot, lambda: turn.region.bottom <= tr.region.y,
                               what="the open turn above the view")
        turn.collapsed = True  # as an answer closes its turns when it is done
        await stays_at_end("a turn closed above the view")
        await type_and_enter(pilot, "seven?")  # and the chat still follows its end
        await settle(pilot)
        await pilot_wait_until(pilot, lambda: tr.is_vertical_scroll_end, what="the new answer in view")


# --- item 8 (rendering): model text stays readable ---------------------------------------------------
def test_readable_markdown_escapes_block_markers_the_model_did_not_mean():
    assert readable_markdown(">" * 20) == "\\" + ">" * 20
    assert readable_markdown("# Big\n## also") == "\\# Big  \n\\## also"  # each line ends in a hard break
    assert readable_markdown("- - - - x") == "- \\- - - x" and readable_markdown("1. 2. x") == "1. 2\\. x"
    assert readable_markdown("Title\n=====") == "Title  \n\\====="
    kept = "**bold**, `code`, [a link](https://x.org)\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    assert readable_markdown(kept) == kept.replace("\n", "  \n").replace("  \n  \n", "  \n\n")
    assert readable_markdown("```\n> quoted in code\n# too\n```\n> after") == ("```\n> quoted in code\n# "
                                                                               "too\n```\n\\> after")
    assert readable_markdown("bell\x07 and \x1b[2J clear\x9b") == "bell and [2J clear"


SHOUTING = ">>>>>>>>>>>>>>>>>>>> yes\n# THE ANSWER\n- - - - - deep\nbell\x07 **OK**"
POEM = "Autumn leaves, a sight to behold,\nA palette of colors, a reminder of the past.\n\nThey fall."


def streamed(answer: str, pieces: list[str]):
    """A script answering ``answer`` in one turn, streamed as ``pieces``."""
    def script(asked: Asked) -> list[ev.Event]:
        started = ev.RunStarted(question=asked.question, image=asked.image, mode="ssr", seprod=False,
                                model="m")
        return [started, ev.TurnStarted(turn=1), *(ev.AnswerToken(turn=1, text=part) for part in pieces),
                ev.FinalAnswer(answer=answer, turns=1, stop_reason="answered", totals={})]
    return script


# An answer a small model might write: quote markers, a heading, nested bullets, a control byte.
shouting = streamed(SHOUTING, [SHOUTING[:7], SHOUTING[7:30], SHOUTING[30:]])
# The 1.5B's answer to "Write a short poem about autumn leaves.", streamed a few characters at a time.
poem = streamed(POEM, [POEM[i:i + 5] for i in range(0, len(POEM), 5)])


async def answer_markdown_live_then_stored(app, pilot, question: str):
    """Ask ``question``; yield the answer's Markdown widget live, then in the stored chat opened again."""
    await settle(pilot)
    await type_and_enter(pilot, question)
    await settle(pilot)
    chat_id = app.chat_screen.chat_id
    for _ in range(2):
        md = app.chat_screen.transcript.answers()[-1].query_one(Markdown)
        await pilot.pause()
        yield md
        await app.chat_screen.open_chat(app.store.load(chat_id))
        await pilot.pause()


@pytest.mark.asyncio
async def test_model_markdown_cannot_nest_quotes_or_shout(settings, tmp_path):
    """Streamed and stored alike: no quote bars, no heading, no control byte; the bold stays bold."""
    app, _ = scripted_app(settings, tmp_path, script=shouting)
    async with app.run_test(size=SIZE) as pilot:
        async for md in answer_markdown_live_then_stored(app, pilot, "Well?"):
            assert not md.query(MarkdownBlockQuote) and not md.query(MarkdownHeader)
            assert ">" * 20 in md.source and "\x07" not in md.source and "**OK**" in md.source


@pytest.mark.asyncio
async def test_a_line_the_model_breaks_stays_a_line(settings, tmp_path):
    """A poem's lines stay lines, streamed and stored (by CommonMark's rule a single newline is a space: the
    app showed the poem as one run-on paragraph); a blank line still starts a paragraph."""
    app, _ = scripted_app(settings, tmp_path, script=poem)
    async with app.run_test(size=SIZE) as pilot:
        asked = "Write a short poem about autumn leaves."
        async for md in answer_markdown_live_then_stored(app, pilot, asked):
            first, second = md.query(MarkdownParagraph)
            assert str(first._content) == POEM.split("\n\n")[0]
            assert str(second._content) == "They fall."


# --- item 15: the app's small things ------------------------------------------------------------------
@pytest.mark.asyncio
async def test_first_run_focus_is_in_the_path_field(settings):
    """Typing a path that holds a d or an r goes into the field: no download screen, no reload."""
    loads = []

    def factory(s, *, progress=None):
        loads.append(s.model)
        raise ModelFileError("No model is installed.", title="No model")

    app = EdgeAgentApp(settings, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, FirstRunScreen)
        await pilot.press(*"/data/r.gguf")
        await settle(pilot)
        assert app.screen is screen and screen.query_one("#model-path", Input).value == "/data/r.gguf"
        assert loads == [""]


@pytest.mark.asyncio
async def test_ctrl_t_opens_every_answers_reasoning_new_ones_included(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for question in ("first?", "second?"):  # Ctrl+T between the two: both open, the new one too
            if question == "second?":
                await pilot.press("ctrl+t")
            await type_and_enter(pilot, question)
            await settle(pilot)
        views = app.chat_screen.transcript.answers()
        assert len(views) == 2 and all(not t.collapsed for v in views for t in v.turns.values())
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert all(t.collapsed for v in views for t in v.turns.values())
        await type_and_enter(pilot, "third?")
        await settle(pilot)
        assert all(t.collapsed for t in app.chat_screen.transcript.answers()[-1].turns.values())


@pytest.mark.asyncio
async def test_status_bar_at_60_columns_keeps_busy_ready_and_the_network(settings, tmp_path):
    app, _ = scripted_app(settings, tmp_path, hold=True)
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(pilot)
        bar = app.screen.query_one(StatusBar)
        text = str(bar.render())
        assert text.rstrip().endswith("ready") and "online" in text and len(text) <= bar.content_size.width
        await type_and_enter(pilot, "A question?")
        await pilot_wait_until(pilot, lambda: str(bar.render()).rstrip().endswith("busy"), what="busy")
        assert "online" in str(bar.render())
        await pilot.press("escape")
        await settle(pilot)


@pytest.mark.asyncio
async def test_image_on_a_text_only_model_is_refused_at_once(settings, tmp_path, image):
    app, engines = scripted_app(settings, tmp_path, vision=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for typed in (f"/image {image}", str(image)):
            before = len(app._notifications)
            await type_and_enter(pilot, typed)
            assert "Model cannot see images" in titles(app)[before:]
            assert app.chat_screen.image is None
        assert engines[0].asked == [] and engines[0].prepared == []
        assert all(img is None for _, img, _ in engines[0].read)  # nothing of the image read ahead


def _tool_turn_script(asked: Asked) -> list[ev.Event]:
    """A search turn whose result took 13.16 s to read into the context, then the answer."""
    return [
        ev.RunStarted(question=asked.question, image=None, mode="ssr", seprod=False, model="m"),
        ev.ContextOpened(source="new", reason="", tokens_reused=0, tokens_evaluated=400,
                         system_restored=False,
                         n_ctx_used=400, seconds=2.5),
        ev.TurnStarted(turn=1),
        ev.ToolCalled(turn=1, name="text_search", arguments={"query": "bicycle"}, action_seconds=1.5),
        ev.ToolFinished(turn=1, name="text_search", ok=True, observation="1. Bicycle ...", seconds=1.0,
                        status="cached"),
        ev.TurnFinished(turn=1, action="text_search", reasoning_seconds=0.5, action_seconds=1.5,
                        tool_seconds=1.0,
                        observe_seconds=13.16),
        ev.TurnStarted(turn=2),
        ev.AnswerToken(turn=2, text="Pedals."),
        ev.TurnFinished(turn=2, action="answer", reasoning_seconds=0.4, action_seconds=1.0, tool_seconds=0.0),
        ev.FinalAnswer(answer="Pedals.", turns=2, stop_reason="answered",
                       totals={"total": 20.06, "prompt": 2.5, "observe": 13.16}),
    ]


@pytest.mark.asyncio
async def test_turn_timings_include_reading_the_tool_result(settings, tmp_path):
    """A turn's line says how long its tool's result took to read into the context (as `ask`'s trace does),
    so the turns and the context line add up to the question's time (issue 30 item 5)."""
    app, _ = scripted_app(settings, tmp_path, script=_tool_turn_script)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "How does a bicycle work?")
        await settle(pilot)
        view = app.chat_screen.transcript.answers()[0]
        title = str(view.turns[1].title)
        assert "reading 13.2 s" in title, title
        assert "reading" not in str(view.turns[2].title)  # an answer turn reads no result


@pytest.mark.asyncio
async def test_a_seprod_answer_is_shown_once(settings, tmp_path):
    """The prophet's part of the answer is said in words and counts, not repeated as text above the answer
    (issue 30 item 9: it was shown three times); the same when the chat is opened again."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "What does the sign say?")
        await settle(pilot)
        for _ in range(2):
            view = app.chat_screen.transcript.answers()[-1]
            note = str(view.query_one(".prophet-note", Static).render())
            assert "The sign says" not in note and "3 tokens" in note and "3/4 drafted" in note, note
            assert view.text.startswith("The sign says")
            await app.chat_screen.open_chat(app.store.load(app.chat_screen.chat_id))
            await settle(pilot)


@pytest.mark.asyncio
async def test_a_turns_title_wraps_in_a_narrow_window(settings, tmp_path):
    """A turn's title longer than the window wraps inside it: at 120 columns (the side panel beside it) the
    1.5B's "Turn 1 · text_search · reasoning 1 ms, action 2.0 s, tool 27 ms, reading 2.1 s" lost its end
    ("reading 2."), clipped by the transcript."""
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=(46, 24)) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, "A question?")
        await settle(pilot)
        tr = app.chat_screen.transcript
        titles_ = list(tr.query(CollapsibleTitle))
        assert titles_
        for title in titles_:
            label = str(title.render()).rstrip()
            assert title.region.right <= tr.region.right, (label, title.region, tr.region)
            assert title.size.height * title.size.width >= len(label)  # all of it shows
        assert any(title.size.height > 1 for title in titles_)  # one was too long for a line
