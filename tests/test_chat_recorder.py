"""One chat recorder for the app and `edge-agent ask` (edge_agent/chat/recorder.py): when an exchange is
written, and the one derivation of an answer's status."""

from __future__ import annotations

import pytest

from edge_agent.agent import events as ev
from edge_agent.chat.recorder import AnswerStatus, ExchangeRecorder
from edge_agent.chat.store import ChatStore
from edge_agent.core.errors import Cancelled, EdgeAgentError

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


def test_the_app_opens_the_exchange_when_it_sends_and_reads_the_continuation_between(store):
    first = ExchangeRecorder(store, None, "Q1?", [], {})
    mid = first.open()
    store.add_event(mid,
                    ev.FinalAnswer(answer="A1", turns=1, stop_reason="answered", totals={}, context="k1"))
    first.finish("answered")
    again = ExchangeRecorder(store, first.chat_id, "Q1 again?", [], {}, replace_last=True)
    again.open()  # a retry: continues from before the exchange it replaces
    assert again.continuation is not None and again.continuation.context == ""
    follow = ExchangeRecorder.opened(store, again.open())
    follow.add(FINAL)
    follow.finish("answered")
    assert [m.text for m in store.load(first.chat_id).messages] == ["Q1?", "A1", "Q1 again?", "Paris"]


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
