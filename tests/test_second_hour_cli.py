"""Issue 23 (the second hour without surprises), the command-line items: model text cleaned of
control characters, failed asks not saved, chats that remember their models, config validation,
long questions, damaged history recovered, `chats show/export`, top-level app options, downloads.

Real parts: `edge-agent` in a subprocess (or click's runner where only the command's logic is
tested) on the tiny random-weight Qwen3-VL models and a real SQLite file; nothing touches the network.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from edge_agent.textclean import clean_model_text

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def edge(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``edge-agent ARGS`` in a subprocess (the environment of the test: EDGE_AGENT_HOME etc.)."""
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, errors="surrogateescape")


SMALL = {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "4096", "ANSWER_MAX_TOKENS": "60", "MAX_TURNS": "1"}


@pytest.fixture
def env(edge_home, monkeypatch):
    """edge_home with small, fast settings for the tiny models (one thread, one turn, 60-token answers)."""
    [monkeypatch.setenv(f"EDGE_AGENT_{k}", v) for k, v in SMALL.items()]
    return edge_home


def tiny(tiny_models) -> list[str]:
    return ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"])]


# --- item 8: control characters ---------------------------------------------------------------------
def test_clean_model_text_keeps_newline_tab_and_unicode():
    """C0 (but newline and tab), DEL and C1 go; everything else stays."""
    assert clean_model_text("a\x04b\x1b[2Jc\td\ne\x7f\x9bf\r") == "ab[2Jc\td\nef"
    assert clean_model_text("Straße → 東京 🙂 שלום") == "Straße → 東京 🙂 שלום"


def test_ask_prints_and_saves_no_control_characters(env, tiny_models, image):
    """The tiny model sampled hot writes \\x01, \\x03, \\x19 ... (seeds 2-4): neither stdout, --json, the
    trace nor the saved chat carries them."""
    hot = {"EDGE_AGENT_TEMPERATURE": "1.5"}
    for seed in ("2", "3"):
        r = edge("ask", str(image), "What colour?", *tiny(tiny_models), "--offline", "--seed", seed, env=hot)
        assert r.returncode in (0, 1), r.stderr
        assert r.stdout.strip() and not CONTROLS.search(r.stdout) and not CONTROLS.search(r.stderr)
    r = edge("ask", str(image), "What colour?", *tiny(tiny_models), "--offline", "--seed", "4", "--json", env=hot)
    assert r.returncode in (0, 1), r.stderr
    final = json.loads(r.stdout.splitlines()[-1])
    assert final["answer"] and not CONTROLS.search(r.stdout) and not CONTROLS.search(final["answer"])
    from edge_agent.chats import ChatStore

    store = ChatStore(env / "chats.sqlite3")
    try:
        for c in store.list_chats():
            for m in store.load(c.id).messages:
                assert not CONTROLS.search(m.text)
            assert not CONTROLS.search(json.dumps(store.export_json(c.id), ensure_ascii=False))
    finally:
        store.close()


def test_chats_written_before_cleaning_load_and_export_clean(edge_home):
    """An answer stored with control bytes by an older version reads and exports without them."""
    from edge_agent.agent import events as ev
    from edge_agent.chats import ChatStore

    store = ChatStore(edge_home / "chats.sqlite3")
    try:
        chat = store.new_chat()
        store.add_user_message(chat, "Q?")
        mid = store.start_answer(chat)
        store._exec("INSERT INTO events(message_id, seq, kind, data) VALUES (?, 0, 'answer_token', ?)",
                    (mid, json.dumps(ev.AnswerToken(turn=1, text="ok\x18\x1b[31m").to_json())))
        store._exec("UPDATE messages SET text=?, status='answered' WHERE id=?", ("ok\x18\x1b[31m", mid))
        assert store.load(chat).messages[-1].text == "ok[31m"
        assert not CONTROLS.search(store.export_markdown(chat) + json.dumps(store.export_json(chat)))
        store.add_event(store.start_answer(chat), ev.FinalAnswer(answer="a\x02b", turns=1, stop_reason="answered"))
        assert store.load(chat).messages[-1].text == "ab"
    finally:
        store.close()
