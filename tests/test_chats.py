"""Chat persistence: event-by-event writes, crash survival, resume, rename, delete, export."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from urllib.parse import quote, quote_plus

import pytest

from edge_agent.agent import events as ev
from edge_agent.agent.events import event_from_json
from edge_agent.chat import export as chat_export
from edge_agent.chat.store import ChatStore, ChatStoreError
from tests.fakes.engines import script
from tests.files import make_image


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3", secrets=["SECRETKEY123"])
    yield s
    s.close()


def _record(store, chat_id, question, image, crop):
    store.add_user_message(chat_id, question, image)
    mid = store.start_answer(chat_id)
    for e in script(question, image, crop):
        store.add_event(mid, e)
    return mid


def test_every_event_kind_round_trips_through_json(tmp_path):
    """event_from_json(e.to_json()) == e for every event of a full scripted run (tuples restored)."""
    for e in script("q", "/x.png", "/crop.png"):
        back = event_from_json(json.loads(json.dumps(e.to_json())))
        assert back == e
    assert event_from_json({"event": "from_the_future", "x": 1}) is None
    assert event_from_json({"event": "turn_started"}) is None  # a field missing (another version): skipped
    assert event_from_json({"event": "rationale_scored", "turn": 1, "candidates": [{"id": "x"}], "chosen": 0,
                            "seconds": 0.0}) is None  # a nested value that does not fit


def test_resume_returns_messages_and_typed_events(store, tmp_path):
    """A finished answer loads back with its text, status and the exact event sequence."""
    img = str(make_image(tmp_path / "a.png"))
    cid = store.new_chat()
    _record(store, cid, "What does the sign say?", img, str(make_image(tmp_path / "c.png")))
    chat = store.load(cid)
    assert chat.title == "What does the sign say?"
    user, answer = chat.messages
    assert (user.role, user.image) == ("user", img)
    assert answer.status == "answered"
    assert answer.text.startswith("The sign says **OPEN**")
    assert [e.kind for e in answer.events] == [e.kind for e in script("q", img, None)]
    scored = [e for e in answer.events if isinstance(e, ev.RationaleScored)][0]
    assert scored.chosen == 2 and abs(scored.candidates[2].prob - 0.55) < 1e-9
    assert store.history(cid) == [{"question": "What does the sign say?", "image": img,
                                   "answer": answer.text}]


def test_several_images_per_chat(store, tmp_path):
    cid = store.new_chat()
    a, b = (str(make_image(tmp_path / n)) for n in ("a.png", "b.png"))
    _record(store, cid, "first", a, None)
    _record(store, cid, "second", b, None)
    assert store.load(cid).images == [a, b]


def test_answer_survives_a_killed_process(tmp_path):
    """Events committed before the process dies are there on the next open; the answer reads 'interrupted'."""
    db = tmp_path / "chats.sqlite3"
    code = f"""
import os
from edge_agent.chat.store import ChatStore
from tests.fakes.engines import script
s = ChatStore({str(db)!r})
cid = s.new_chat()
s.add_user_message(cid, "q", None)
mid = s.start_answer(cid)
for e in script("q", None, None)[:-4]:  # stop inside the streamed answer
    s.add_event(mid, e)
os._exit(9)  # no close, no commit hooks: like a kill
"""
    r = subprocess.run([sys.executable, "-c", code],
                       cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert r.returncode == 9
    s = ChatStore(db)
    chat = s.load(s.list_chats()[0].id)
    answer = chat.messages[1]
    assert answer.status == "interrupted"
    assert answer.text == "The sign says"  # the streamed part is kept
    assert sum(isinstance(e, ev.ToolFinished) for e in answer.events) == 2
    s.close()


def test_cancelled_answer_keeps_partial_text(store):
    cid = store.new_chat()
    store.add_user_message(cid, "q")
    mid = store.start_answer(cid)
    store.add_event(mid, ev.AnswerToken(turn=1, text="Part"))
    store.finish_answer(mid, "cancelled")
    m = store.load(cid).messages[1]
    assert (m.status, m.text) == ("cancelled", "Part")


def test_rename_delete_and_order(store):
    a = store.new_chat()
    b = store.new_chat()
    store.add_user_message(a, "newest activity")
    assert [c.id for c in store.list_chats()] == [a, b]
    store.rename(b, "  My   chat ")
    assert store.load(b).title == "My chat"
    with pytest.raises(ChatStoreError):
        store.rename(b, "   ")
    store.delete(a)
    assert [c.id for c in store.list_chats()] == [b]
    with pytest.raises(ChatStoreError):
        store.load(a)
    # the cascade removed its messages and events too
    n = store._exec("SELECT COUNT(*) FROM messages WHERE chat_id=?", (a,)).fetchone()[0]
    assert n == 0


def test_export_markdown_and_json_with_crops_scores_and_no_secrets(store, tmp_path):
    """The export holds tool calls, the crop image (copied), the rationale scores; never an API key."""
    img = str(make_image(tmp_path / "photo.png"))
    crop = str(make_image(tmp_path / "crop.png", (16, 16)))
    cid = store.new_chat()
    mid = _record(store, cid, "What does the sign say?", img, crop)
    store.add_event(mid, ev.AgentError(turn=4, title="Search failed", message="key SECRETKEY123 rejected"))
    md_path, json_path = chat_export.export(store, cid, tmp_path / "out")
    md = md_path.read_text()
    data = json.loads(json_path.read_text())
    assert "image_zoom_in_tool" in md and "text_search" in md
    assert "| **>** | The detail I need is small" in md and "0.55" in md
    assert "[cached]" in md and "Open sign" in md
    assert "accepted 3/4" in md
    crop_refs = [line for line in md.splitlines() if line.startswith("![crop](")]
    assert crop_refs and (md_path.parent / crop_refs[0][8:-1]).is_file()
    assert "SECRETKEY123" not in md and "SECRETKEY123" not in json_path.read_text()
    kinds = [e["event"] for e in data["messages"][1]["events"]]
    assert "rationale_scored" in kinds and "tool_finished" in kinds
    assert data["messages"][1]["events"][2]["candidates"][2]["prob"] == 0.55


def test_url_encoded_key_never_reaches_the_chat_file(tmp_path):
    """A key with URL-special characters, echoed URL-encoded in a result or an answer, is stored as ***."""
    key = "sk-live/Key+42 x=="
    encoded, plus = quote(key, safe=""), quote_plus(key)  # sk-live%2FKey%2B42%20x%3D%3D, ...%2B42+x%3D%3D
    db = tmp_path / "c.sqlite3"
    store = ChatStore(db, secrets=[key])
    cid = store.new_chat()
    store.add_user_message(cid, "where is it?")
    mid = store.start_answer(cid)
    url = f"https://api.example/search?q=x&api_key={encoded}"
    store.add_event(mid, ev.ToolFinished(turn=1, name="text_search", ok=False, observation=f"failed: {url}",
                                         seconds=0.1,
                                         status="error",
                                         results=({"title": "t", "url": url, "snippet": plus},)))
    store.add_event(mid, ev.FinalAnswer(answer=f"see {url.replace('api_key=', 'k=')}", turns=1,
                                        stop_reason="answered"))
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("c.sqlite3*"))
    for form in (key, encoded, plus, "Key%2B42"):
        assert form.encode() not in raw
    back = ChatStore(db, secrets=[key])
    finished = [e for e in back.message_events(mid) if isinstance(e, ev.ToolFinished)][0]
    assert "***" in finished.results[0]["url"] and "***" in back.load(cid).messages[1].text
    back.close()


def test_newer_schema_is_refused_with_a_fix(tmp_path):
    db = tmp_path / "c.sqlite3"
    con = sqlite3.connect(db)
    con.execute("PRAGMA user_version=99")
    con.close()
    with pytest.raises(ChatStoreError, match="newer edge-agent"):
        ChatStore(db)


def test_a_file_that_is_not_sqlite_is_set_aside(tmp_path):
    """Issue 23: a damaged history is kept aside and a new one started (tests/test_cli_saved_state.py
    salvages truncated and damaged files); a file with nothing readable recovers no chats."""
    from edge_agent.core.recovery import take_notices

    db = tmp_path / "c.sqlite3"
    db.write_bytes(b"this is not sqlite" * 100)
    store = ChatStore(db)
    assert store.list_chats() == []
    store.close()
    assert [p.read_bytes() for p in tmp_path.glob("c.sqlite3.damaged-*")] == [b"this is not sqlite" * 100]
    assert any("Recovered 0 chats" in n for n in take_notices())


def test_a_version_1_chat_file_gains_the_context_column(tmp_path):
    """A chat history written before saved context states opens, keeps its chats, and records keys."""
    import sqlite3

    from edge_agent.agent import events as ev
    from edge_agent.chat.store import ChatStore

    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
            updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')), text TEXT NOT NULL DEFAULT '',
            image TEXT,
            status TEXT NOT NULL DEFAULT 'done', created REAL NOT NULL);
        CREATE TABLE events (id INTEGER PRIMARY KEY,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL);
        INSERT INTO chats VALUES (1, 'old chat', 1.0, 1.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'Old question?', NULL, 'done', 1.0);
        INSERT INTO messages VALUES (2, 1, 'assistant', 'Old answer.', NULL, 'answered', 1.0);
        PRAGMA user_version=1;
    """)
    db.close()
    store = ChatStore(path)
    cont = store.continuation(1)
    # rebuilt from text
    assert cont.exchanges == [("Old question?", "Old answer.", "")] and cont.context == ""
    store.add_user_message(1, "New?")
    m = store.start_answer(1)
    store.add_event(m, ev.FinalAnswer(answer="Yes.", turns=1, stop_reason="answered", context="abc"))
    assert store.continuation(1).context == "abc" and store.continuation(1).history[-1] == ("New?", "Yes.")
    # the messages written before the search index existed are found too (issue 30 item 8), and new ones
    assert list(store.search("old answ")) == [1] and list(store.search("yes")) == [1]
    assert store.search("nowhere") == {} and store.search('"unbalanced') == {}
    store.close()


def test_an_answer_without_its_search_says_so_in_show_and_export(store, tmp_path, monkeypatch):
    """A stored answer whose search failed, or that went without the search asked for (offline, nothing
    cached), says so under it in `chats show` and the Markdown export, as the app's footer and `ask` do
    (an answer stored before FinalAnswer.not_searched: its failed search's event alone); one with no such
    search says nothing."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    cid = store.new_chat()
    store.add_user_message(cid, "Search the web for the capital of Peru.")
    mid = store.start_answer(cid)
    asked = "the question asks for a search; text_search is not offered: it is offline and nothing is cached"
    store.add_event(mid, ev.FinalAnswer(answer="According to Wikipedia, Lima.", turns=1,
                                        stop_reason="answered", not_searched=(asked,)))
    store.add_user_message(cid, "And of Chile?")
    mid = store.start_answer(cid)
    failed = "text_search failed (searxng): cannot connect (Connection refused)"
    store.add_event(mid, ev.ToolFinished(turn=1, name="text_search", ok=False, seconds=0.1,
                                         status="unreachable", observation=f"{failed}. Try later."))
    store.add_event(mid, ev.FinalAnswer(answer="Santiago.", turns=2, stop_reason="answered"))
    store.add_user_message(cid, "And of Bolivia?")
    mid = store.start_answer(cid)
    store.add_event(mid, ev.FinalAnswer(answer="Sucre.", turns=1, stop_reason="answered"))
    md = chat_export.export_markdown(store, cid)
    assert f"_Note: {asked}: answered without its results._" in md
    assert f"_Note: {failed}: answered without its results._" in md and md.count("_Note:") == 2
    store.close()
    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path))  # the store fixture's file is its chats.sqlite3
    r = CliRunner().invoke(cli, ["chats", "show", str(cid)], catch_exceptions=False)
    lines = r.stdout.splitlines()
    i = lines.index("edge-agent: According to Wikipedia, Lima.")
    assert lines[i + 1] == f"  note: {asked}: answered without its results"
    i = lines.index("edge-agent: Santiago.")
    assert lines[i + 1] == f"  note: {failed}: answered without its results"
    assert lines[lines.index("edge-agent: Sucre.") + 1:] == []


def test_the_export_says_why_a_move_was_taken_back(store):
    """A move taken back (an unsure answer, a repeated search) changes the next choice; the Markdown export
    showed the two rationale tables one after the other with nothing between them. It now says what was
    taken back and why, and a sure answer check, as the app and `ask` do."""
    cid = store.new_chat()
    store.add_user_message(cid, "What does the small sign say?")
    mid = store.start_answer(cid)
    why = ("the model is not sure of its answer ('prelim'...: mean log-prob -5.11 of what it adds to the "
           "question, below answer_check -0.225): it zooms in first")
    store.add_event(mid, ev.AnswerChecked(turn=1, pieces=("pre", "lim"), logprobs=(-5.0, -5.2), score=-5.11,
                                          threshold=-0.225, sure=False))
    store.add_event(mid, ev.MoveWithdrawn(turn=1, action="answer", arguments={}, reason=why))
    store.add_event(mid, ev.MoveWithdrawn(turn=2, action="text_search", arguments={"query": "Peru"},
                                          reason="it already searched that"))
    store.add_event(mid, ev.AnswerChecked(turn=2, pieces=("Open", " 9"), logprobs=(-0.1, -0.05), score=-0.08,
                                          threshold=-0.225, sure=True))
    store.add_event(mid, ev.FinalAnswer(answer="Open 9-5.", turns=2, stop_reason="answered"))
    md = chat_export.export_markdown(store, cid)
    assert f"Taken back: `answer`: {why}" in md
    assert 'Taken back: `text_search` `{"query": "Peru"}`: it already searched that' in md
    assert ("Answer check: sure ('Open 9': mean log-prob -0.08 of what it adds to the question, at least "
            "-0.225)") in md
    assert md.count("Answer check") == 1  # the unsure one is the answer taken back


def test_chats_are_listed_renamed_and_deleted_from_the_command_line(store, tmp_path, monkeypatch):
    """`chats list` lists as `chats` does; `chats rename` and `chats delete` do what the app's chat list does
    (Ctrl+O: r, d), asking first unless --yes; an unknown id deletes none of the ids given; a chat being
    answered (its lock held by another process) is neither renamed nor deleted."""
    from click.testing import CliRunner

    from edge_agent.chat.lock import ChatLock
    from edge_agent.commands.cli import cli

    a, b = store.new_chat("Bike shop"), store.new_chat("Peru")
    for cid in (a, b):
        store.add_user_message(cid, "What is this?")
        store.add_event(store.start_answer(cid), ev.FinalAnswer(answer="A shop.", turns=1,
                                                                stop_reason="answered"))
    store.close()
    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path))
    run = CliRunner().invoke
    listed = run(cli, ["chats", "list", "--json"], catch_exceptions=False)
    assert listed.stdout == run(cli, ["chats", "--json"], catch_exceptions=False).stdout
    assert [json.loads(x)["title"] for x in listed.stdout.splitlines()] == ["Peru", "Bike shop"]

    r = run(cli, ["chats", "rename", str(a), "Bike", "shop", "door"], catch_exceptions=False)
    assert r.exit_code == 0 and r.stdout == f'chat {a}: "Bike shop" renamed "Bike shop door"\n'
    r = run(cli, ["chats", "delete", str(b), "999", "--yes"])
    assert r.exit_code != 0 and "There is no chat 999" in r.output
    r = run(cli, ["chats", "delete", str(b)], input="n\n")
    assert r.exit_code == 1 and f'Delete chat {b} "Peru" (2 messages) for good?' in r.output
    lock = ChatLock(tmp_path, b, "edge-agent ask (pid 1)")
    assert lock.try_acquire()  # flock is per open file: the command's own descriptor contends with this one
    r = run(cli, ["chats", "delete", str(b), "--yes"])
    assert r.exit_code != 0 and f"Chat {b} is being answered by edge-agent ask (pid 1)" in r.output
    lock.release()
    assert "Peru" in run(cli, ["chats"], catch_exceptions=False).stdout  # nothing deleted so far

    r = run(cli, ["chats", "delete", str(b), "--yes"], catch_exceptions=False)
    assert r.stdout == f'deleted chat {b} "Peru" (2 messages)\n'
    from edge_agent.chat.store import ChatStore

    again = ChatStore(tmp_path / "chats.sqlite3")
    assert [c.id for c in again.list_chats()] == [a]
    assert again._exec("SELECT COUNT(*) FROM messages WHERE chat_id=?", (b,)).fetchone()[0] == 0
    again.close()
