"""One chat recorder for the app and `edge-agent ask` (edge_agent/chat/recorder.py): when an exchange is
written, and the one derivation of an answer's status."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.agent import events as ev
from edge_agent.chat.recorder import AnswerStatus, ExchangeRecorder
from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings
from edge_agent.core.errors import Cancelled, EdgeAgentError
from edge_agent.ui.app import EdgeAgentApp
from tests.fakes.engines import Asked, ScriptedEngine
from tests.pilot import settle, type_and_enter

START = ev.RunStarted(question="Q?", image=None, mode="ssr", seprod=False, model="m")
OPENED = ev.ContextOpened(source="new", reason="", tokens_reused=0, tokens_evaluated=10,
                          system_restored=False,
                          n_ctx_used=10, seconds=0.1)
REFUSED = ev.AgentError(turn=0, title="Image problem", message="unreadable", fatal=True)
FINAL = ev.FinalAnswer(answer="Paris", turns=1, stop_reason="answered", totals={})


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_a_question_refused_before_the_model_read_it_adds_nothing(store):
    rec = ExchangeRecorder(store, None, "Q?", ["/gone.png"], {})
    for e in (START, REFUSED):
        rec.add(e)
    rec.finish("error")
    assert rec.message_id is None and store.list_chats() == []


def test_an_answer_is_written_from_the_first_event_the_model_read(store):
    rec = ExchangeRecorder(store, 0, "Q?", [], {"model": "/m.gguf"})
    status = AnswerStatus()
    for e in (START, OPENED, FINAL):
        rec.add(e)
        status.see(e)
    rec.finish(status.end(cancelled=False))
    chat = store.load(rec.chat_id)
    user, answer = chat.messages
    assert (user.role, user.text, answer.status, answer.text) == ("user", "Q?", "answered", "Paris")
    assert [e.kind for e in answer.events] == ["run_started", "context_opened", "final_answer"]
    assert store.continuation(rec.chat_id).models == {"model": "/m.gguf"}


def test_a_retry_reads_what_it_continues_before_anything_is_written(store):
    first = ExchangeRecorder(store, None, "Q1?", [], {})
    for e in (START, ev.FinalAnswer(answer="A1", turns=1, stop_reason="answered", totals={}, context="k1")):
        first.add(e)
    first.finish("answered")
    assert first.chat_id is not None
    cid = first.chat_id
    assert store.continuation(cid).context == "k1"
    before = store.load(cid).messages
    cont = store.continuation(cid, replace_last=True)  # a retry continues from before what it replaces
    assert (cont.context, cont.turns) == ("", []) and store.load(cid).messages == before  # read only
    again = ExchangeRecorder(store, cid, "Q1 again?", [], {}, replace_last=True)
    for e in (START, FINAL):
        again.add(e)
    again.finish("answered")
    chat = store.load(cid)
    assert [(m.text, m.replaced) for m in chat.messages] == [
        ("Q1?", True), ("A1", True), ("Q1 again?", False), ("Paris", False)]
    assert store.continuation(cid).turns == [("Q1 again?", "Paris", None)]


def test_a_new_chat_is_handed_over_as_it_is_made(store):
    made: list[int] = []
    rec = ExchangeRecorder(store, None, "Q?", [], {}, on_new_chat=made.append)
    rec.add(START)
    assert made == []
    rec.add(OPENED)
    assert made == [rec.chat_id] and [c.id for c in store.list_chats()] == made


def test_one_derivation_of_an_answer_s_status():
    def of(*events: ev.Event, cancelled: bool = False) -> str:
        s = AnswerStatus()
        for e in events:
            s.see(e)
        return s.end(cancelled=cancelled)

    assert of(START, FINAL) == "answered" and of(START, REFUSED) == "error"
    assert of(START, ev.FinalAnswer(answer="", turns=1, stop_reason="cancelled", totals={})) == "cancelled"
    assert of(START) == "answered" and of(START, cancelled=True) == "cancelled"
    s = AnswerStatus()
    s.see(REFUSED)
    assert (s.status, s.title, s.message) == ("error", "Image problem", "unreadable")
    assert (AnswerStatus().failed(Cancelled()) == "cancelled"
            and AnswerStatus().failed(KeyboardInterrupt()) == "cancelled")
    busy = AnswerStatus()
    assert busy.failed(EdgeAgentError("The engine is busy.",
                                      title="Busy")) == "error" and busy.title == "Busy"
    assert AnswerStatus().failed(RuntimeError("a bug")) == "error"


# --- the app and `ask` write an exchange by one rule --------------------------------------------------

ANSWERED = [START, OPENED, ev.AnswerToken(turn=1, text="Paris"),
            ev.FinalAnswer(answer="Paris", turns=1, stop_reason="answered", totals={}, context="k")]
IMAGE_REFUSED = [START, ev.AgentError(turn=0, title="Model cannot see images",
                                      message="This model reads text only.", fatal=True)]


def rows(path: Path) -> tuple[int, list[tuple[str, str, str]], int]:
    """What the chat store holds: (chats, the messages' role, text and status, events)."""
    if not path.exists():
        return 0, [], 0
    db = sqlite3.connect(path)
    try:
        return (db.execute("SELECT COUNT(*) FROM chats").fetchone()[0],
                [tuple(r) for r in db.execute("SELECT role, text, status FROM messages ORDER BY id")],
                db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    finally:
        db.close()


def watching(events: list[ev.Event], path: Path, seen: list[Any]):
    """A script that yields ``events`` and notes the store's rows when the engine got the question and
    after each event was taken (the generator resumes once its caller has recorded it)."""
    def script(asked: Asked) -> Iterator[ev.Event]:
        seen.append(rows(path))
        for e in events:
            yield e
            seen.append(rows(path))
    return script


async def _app_rows(settings: Settings, events: list[ev.Event], image: Path) -> tuple[list[Any], Any]:
    seen: list[Any] = []
    script = watching(events, settings.chats_path, seen)
    app = EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, script=script))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"/image {image}")
        await type_and_enter(pilot, "What city is this?")
        await settle(pilot)
        shown = [v.status for v in app.chat_screen.transcript.answers()]
        assert shown == ["error" if events is IMAGE_REFUSED else "answered"]  # shown either way
        chat_id = app.chat_screen.chat_id
    return seen, chat_id


def _ask_rows(home: Path, events: list[ev.Event], image: Path, monkeypatch) -> list[Any]:
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli
    from edge_agent.engine.engine import Engine
    from edge_agent.modelfiles.resolution import ResolvedModel

    monkeypatch.setenv("EDGE_AGENT_HOME", str(home))
    seen: list[Any] = []
    script = watching(events, Settings.load().chats_path, seen)
    monkeypatch.setattr(Engine, "from_settings",
                        classmethod(lambda cls, s, **kw: ScriptedEngine(s, script=script)))
    # the scripted engine stands for a vision model: ask's check before loading (the home's default is the
    # text-only demo) would refuse the image before the engine got the question
    monkeypatch.setattr(ResolvedModel, "require_vision", lambda self: None)
    CliRunner().invoke(cli, ["ask", str(image), "What city is this?", "--json"])
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize("events", [ANSWERED, IMAGE_REFUSED], ids=["answered", "image refused"])
async def test_the_app_and_ask_write_the_same_rows_at_the_same_moments(settings, tmp_path, image, events,
                                                                       monkeypatch):
    """The same question and events, asked in the app and with `edge-agent ask`: the store holds the same
    rows when the engine gets the question and after each event; nothing before the model read the
    question (RunStarted alone), and nothing at all, not even an empty chat, when it is refused."""
    app, app_chat = await _app_rows(settings, events, image)
    home = tmp_path / "ask-home"
    home.mkdir()
    assert _ask_rows(home, events, image, monkeypatch) == app
    assert app[0] == app[1] == (0, [], 0)  # the question, then RunStarted: nothing written yet
    if events is IMAGE_REFUSED:
        assert app[-1] == (0, [], 0) and app_chat is None
    else:
        assert app[2] == (1, [("user", "What city is this?", "done"), ("assistant", "", "running")], 2)
        assert app[-1][1][-1] == ("assistant", "Paris", "answered") and app_chat is not None
