"""What the commands save and read back: model text cleaned of control characters, failed asks not
saved, chats that remember their models, config validation, long questions, damaged history, config
and cache recovered, `chats show/export`, top-level app options, downloads with the network down.

Real parts: `edge-agent` in a subprocess (or click's runner where only the command's logic is
tested) on the tiny random-weight Qwen3-VL models and a real SQLite file; nothing touches the network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from edge_agent.chat import export as chat_export
from edge_agent.core.textclean import clean_model_text
from tests.files import chats_file, damage

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def edge(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``edge-agent ARGS`` in a subprocess (the environment of the test: EDGE_AGENT_HOME etc.)."""
    return subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", *args], capture_output=True,
                          text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, errors="surrogateescape")


SMALL = {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "4096", "ANSWER_MAX_TOKENS": "60",
         "MAX_TURNS": "1"}


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
    r = edge("ask", str(image), "What colour?", *tiny(tiny_models), "--offline", "--seed", "4", "--json",
             env=hot)
    assert r.returncode in (0, 1), r.stderr
    final = json.loads(r.stdout.splitlines()[-1])
    assert final["answer"] and not CONTROLS.search(r.stdout) and not CONTROLS.search(final["answer"])
    from edge_agent.chat.store import ChatStore

    store = ChatStore(env / "chats.sqlite3")
    try:
        for c in store.list_chats():
            for m in store.load(c.id).messages:
                assert not CONTROLS.search(m.text)
            assert not CONTROLS.search(json.dumps(chat_export.export_json(store, c.id), ensure_ascii=False))
    finally:
        store.close()


def test_chats_written_before_cleaning_load_and_export_clean(edge_home):
    """An answer stored with control bytes by an older version reads and exports without them."""
    from edge_agent.agent import events as ev
    from edge_agent.chat.store import ChatStore

    store = ChatStore(edge_home / "chats.sqlite3")
    try:
        chat = store.new_chat()
        store.add_user_message(chat, "Q?")
        mid = store.start_answer(chat)
        store._exec("INSERT INTO events(message_id, seq, kind, data) VALUES (?, 0, 'answer_token', ?)",
                    (mid, json.dumps(ev.AnswerToken(turn=1, text="ok\x18\x1b[31m").to_json())))
        store._exec("UPDATE messages SET text=?, status='answered' WHERE id=?", ("ok\x18\x1b[31m", mid))
        assert store.load(chat).messages[-1].text == "ok[31m"
        md, js = chat_export.export_markdown(store, chat), chat_export.export_json(store, chat)
        assert not CONTROLS.search(md + json.dumps(js))
        store.add_event(store.start_answer(chat),
                        ev.FinalAnswer(answer="a\x02b", turns=1, stop_reason="answered"))
        assert store.load(chat).messages[-1].text == "ab"
    finally:
        store.close()


# --- item 3: a failed ask is not saved ----------------------------------------------------------------
def lone_model(tiny_models, tmp_path) -> Path:
    """A copy of the tiny text model alone in a folder: no mmproj next to it, so it is text only."""
    lone = tmp_path / "lone" / "model.gguf"
    lone.parent.mkdir(exist_ok=True)
    shutil.copy(tiny_models["text"], lone)
    return lone


def chat_rows(home: Path) -> list[tuple]:
    """(chat id, role, status, text) of every stored message, plus (chat id,) for a chat without any."""
    if not (home / "chats.sqlite3").exists():
        return []
    db = sqlite3.connect(home / "chats.sqlite3")
    try:
        return db.execute("SELECT c.id, m.role, m.status, m.text FROM chats c LEFT JOIN messages m "
                          "ON m.chat_id = c.id ORDER BY c.id, m.id").fetchall()
    finally:
        db.close()


def test_a_question_that_never_reached_the_model_is_not_saved(env, tiny_models, image, tmp_path):
    """An image for a text-only model and a model file that is not there: exit 2, no chat, and
    `--continue` on an existing chat adds nothing to it."""
    lone = lone_model(tiny_models, tmp_path)
    r = edge("ask", str(image), "What is this?", "--model", str(lone), "--offline")
    # refused before the model loads (the resolved files say it: "is text only"; the engine's own
    # refusal, after a load that takes the 1.5B 8-18 s, says "has no vision projector")
    assert r.returncode == 2 and "model is text only" in r.stderr and "cannot look at images" in r.stderr
    r = edge("ask", "What is this?", "--model", str(tmp_path / "nope.gguf"), "--offline")
    assert r.returncode == 2 and "not found" in r.stderr
    assert chat_rows(env) == []
    assert edge("chats").stdout.startswith("No chats yet")
    r = edge("ask", "Capital of Peru?", "--model", str(lone), "--offline")
    assert r.returncode in (0, 1), r.stderr
    before = chat_rows(env)
    assert [row[1] for row in before] == ["user", "assistant"]
    r = edge("ask", "--continue", str(image), "And this?", "--model", str(lone), "--offline")
    assert r.returncode == 2 and "cannot look at images" in r.stderr
    assert chat_rows(env) == before


def test_an_answer_that_failed_midway_is_kept_marked_failed(edge_home):
    """Once the model read the question, a fatal error keeps the exchange: status error, text so far."""
    from edge_agent.agent import events as ev
    from edge_agent.chat.recorder import ExchangeRecorder
    from edge_agent.chat.store import ChatStore

    store = ChatStore(edge_home / "chats.sqlite3")
    try:
        w = ExchangeRecorder(store, 0, "Q?", [], {"model": "/m.gguf"})
        w.add(ev.RunStarted(question="Q?", image=None, mode="ssr", seprod=False, model="m"))
        assert store.list_chats() == []
        w.add(ev.ContextOpened(source="new", reason="", tokens_reused=0, tokens_evaluated=50,
                               system_restored=False, n_ctx_used=50, seconds=0.1))
        w.add(ev.AnswerToken(turn=1, text="Half an"))
        w.add(ev.AgentError(turn=1, title="Context full", message="...", fatal=True))
        w.finish("error")
        chat = store.load(w.chat_id)
        assert [(m.role, m.status, m.text) for m in chat.messages] == [
            ("user", "done", "Q?"), ("assistant", "error", "Half an")]
        assert chat.models == {"model": "/m.gguf"} and store.continuation(w.chat_id).context == ""
    finally:
        store.close()


# --- item 4: a chat remembers its model files ------------------------------------------------------
def test_continue_uses_the_chats_models(env, tiny_models, image, tmp_path):
    """A chat made with a vision model and an image continues with that model when the setting now
    names a text-only one (it used to fail with "cannot look at images"), and says so; a model that
    is gone is a clear error naming --model; --model still chooses."""
    vision = tmp_path / "vision"
    vision.mkdir()
    for key in ("text", "mmproj"):
        shutil.copy(tiny_models[key], vision / tiny_models[key].name)
    r = edge("ask", str(image), "What colour?", "--model", str(vision / tiny_models["text"].name),
             "--offline")
    assert r.returncode in (0, 1), r.stderr
    stored = json.loads(sqlite3.connect(env / "chats.sqlite3").execute("SELECT models FROM "
                                                                       "chats").fetchone()[0])
    assert stored == {"model": str(vision / tiny_models["text"].name),
                      "mmproj": str(vision / tiny_models["mmproj"].name),
                      "prophet": "", "prophet_mmproj": ""}
    lone = lone_model(tiny_models, tmp_path)
    assert edge("config", "set", "model", str(lone)).returncode == 0
    r = edge("ask", "--continue", "And the shape?", "--offline")
    assert r.returncode in (0, 1), r.stderr
    assert "continues with the model it was made with" in r.stderr and "--model" in r.stderr
    r = edge("ask", "--continue", "And now?", "--offline", "--json")
    assert json.loads(r.stdout.splitlines()[0])["model"] == tiny_models["text"].stem
    r = edge("ask", "--chat", "1", "Text only?", "--model", str(lone), "--offline", "--json")
    assert r.returncode == 2 and "cannot look at images" in r.stderr  # chose another model: its limits apply
    shutil.rmtree(vision)
    r = edge("ask", "--continue", "Still there?", "--offline")
    assert (r.returncode == 2 and "is gone" in r.stderr and "--model" in r.stderr
            and "Traceback" not in r.stderr)


def test_older_chat_files_gain_the_models_column(tmp_path):
    """A version-2 chat file (before chats recorded models) opens, reads {} and records models."""
    from edge_agent.chat.store import ChatStore

    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    cid = store.new_chat()
    store.close()
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE chats DROP COLUMN models; ALTER TABLE messages DROP COLUMN replaced; "
                     "ALTER TABLE messages DROP COLUMN images; PRAGMA user_version=2;")
    db.close()
    store = ChatStore(path)
    try:
        assert store.continuation(cid).models == {}
        store.start_answer(cid, models={"model": "/a.gguf"})
        assert (store.continuation(cid).models == {"model": "/a.gguf"}
                and store.load(cid).models == {"model": "/a.gguf"})
    finally:
        store.close()


# --- item 5: the prophet's mmproj -------------------------------------------------------------------
def test_ambiguous_prophet_mmproj_names_the_prophet_flag(env, tiny_models, tmp_path):
    """Two mmproj files next to the prophet: the error names --prophet-mmproj (and its setting), not
    --mmproj."""
    folder = tmp_path / "prophet"
    folder.mkdir()
    shutil.copy(tiny_models["prophet"], folder / "prophet.gguf")
    for name in ("mmproj-a.gguf", "mmproj-b.gguf"):
        shutil.copy(tiny_models["mmproj"], folder / name)
    r = edge("ask", "Q?", *tiny(tiny_models), "--prophet", str(folder / "prophet.gguf"), "--offline")
    assert r.returncode == 2 and "Several mmproj files" in r.stderr
    assert ("--prophet-mmproj PATH" in r.stderr and "prophet_mmproj setting" in r.stderr
            and "--mmproj PATH" not in r.stderr)
    r = edge("ask", "Q?", *tiny(tiny_models), "--prophet", str(folder / "prophet.gguf"), "--prophet-mmproj",
             str(folder / "mmproj-a.gguf"), "--offline", "--max-turns", "1")
    assert r.returncode in (0, 1), r.stderr


@pytest.fixture
def app_runs(monkeypatch):
    """The settings and chat the app would open with (its run() recorded instead of taking the terminal)."""
    from edge_agent.ui.app import EdgeAgentApp

    seen: list[tuple] = []
    monkeypatch.setattr(EdgeAgentApp, "run",
                        lambda self, *a, **k: seen.append((self.settings, self.open_chat)))
    return seen


def test_tui_takes_prophet_mmproj(edge_home, app_runs, tmp_path):
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    r = CliRunner().invoke(cli, ["tui", "--prophet", "p.gguf", "--prophet-mmproj", str(tmp_path / "mm.gguf")])
    assert r.exit_code == 0, r.output
    assert app_runs[-1][0].prophet_mmproj == str(tmp_path / "mm.gguf")


# --- item 10: a long question -------------------------------------------------------------------------
def test_a_question_longer_than_a_file_name_is_a_question(env, tiny_models):
    """Hundreds of words as the only argument: asked (no `File name too long` traceback)."""
    question = "Please tell me " + " ".join(["what the small sign on the door"] * 60) + " says?"
    assert len(question) > 1000
    r = edge("ask", question, *tiny(tiny_models), "--offline", "--json")
    assert "Traceback" not in r.stderr and r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout.splitlines()[0])["question"] == question


# --- item 14: the app's options at the top level ------------------------------------------------------
def test_app_options_work_without_tui(edge_home, app_runs):
    """`edge-agent --model X --chat 3` opens the app with them; --help and --version stay the group's."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    r = CliRunner().invoke(cli, ["--model", "x.gguf", "--chat", "3", "--mode", "freeform", "--offline"])
    assert r.exit_code == 0, r.output
    settings, chat = app_runs[-1]
    assert (settings.model, settings.mode, settings.offline, chat) == ("x.gguf", "freeform", True, 3)
    r = edge("--chat", "3", "--help")
    assert r.returncode == 0 and "--prophet-mmproj" in r.stdout and "Usage: edge-agent tui" in r.stdout
    r = edge("--help")
    assert r.returncode == 0 and "Commands:" in r.stdout and "edge-agent --model" in r.stdout
    assert edge("--version").stdout.startswith("edge-agent")
    r = edge("--mode", "nosuch")
    assert r.returncode == 2 and "Invalid value for '--mode'" in r.stderr


# --- item 12: chats show / export on the command line ---------------------------------------------------
def test_chats_show_and_export(env, tiny_models, image, tmp_path):
    """`chats show ID` prints the exchange; `chats export ID` writes what the app's export writes:
    Markdown with the image copied beside it, or JSON with every event; stdout without -o."""
    r = edge("ask", str(image), "What colour is it?", *tiny(tiny_models), "--offline")
    assert r.returncode in (0, 1), r.stderr
    answer = r.stdout.strip()
    r = edge("chats", "show", "1")
    assert r.returncode == 0, r.stderr
    assert "chat 1: What colour is it?" in r.stdout and "You: What colour is it?" in r.stdout
    assert f"image: {image}" in r.stdout and answer in r.stdout and "model tiny-qwen3vl-f32.gguf" in r.stdout
    out = tmp_path / "out" / "chat.md"
    r = edge("chats", "export", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    assert md.startswith("# What colour is it?") and "## edge-agent" in md and "chat_files/00-" in md
    assert (out.parent / "chat_files").is_dir() and len(list((out.parent / "chat_files").iterdir())) == 1
    r = edge("chats", "export", "1", "--format", "json")
    data = json.loads(r.stdout)
    assert data["format"] == "edge-agent-chat" and data["messages"][1]["events"][0]["event"] == "run_started"
    edge("chats", "export", "1", "-o", str(tmp_path / "c.json"))
    assert json.loads((tmp_path / "c.json").read_text())["id"] == 1
    r = edge("chats", "export", "7")
    assert r.returncode == 2 and "There is no chat 7" in r.stderr and "edge-agent chats" in r.stderr
    r = edge("chats", "--json")
    assert json.loads(r.stdout)["id"] == 1


# --- item 9: every setting validated, with its range ---------------------------------------------------
REFUSED = {  # "key value": what the refusal says
    "n_ctx 100": "n_ctx must be at least",  # the number needed (see the next test)
    "seprod_tau 2": "seprod_tau must be between 0 and 1",
    "temperature -1": "temperature must be between 0 and 5",
    "searxng_url notaurl": "searxng_url must be an http:// or https:// URL",
    "theme nosuchtheme": "theme must be empty (the default) or one of ansi-dark",
    "state_cache_mb -5": "Setting state_cache_mb must be at least 0, not -5",
    "max_turns 500": "max_turns must be between 1 and 50",
    "search_timeout 0": "search_timeout must be greater than 0 and at most 600",
    "mmproj /no/such/mmproj.gguf": "mmproj: no file",
}


@pytest.mark.parametrize("setting, says", REFUSED.items())
def test_config_set_refuses_values_that_cannot_work(edge_home, setting, says):
    """Refused with the setting's own name and valid range; nothing saved."""
    r = edge("config", "set", *setting.split(" ", 1))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "observation_max_tokens" not in r.stderr
    assert not (edge_home / "config.toml").exists()


def test_n_ctx_floor_is_what_the_system_prompt_needs(edge_home):
    """The n_ctx floor grows with the user's own instructions; a value at the floor is accepted."""
    from edge_agent.agent.prompts import min_n_ctx
    from edge_agent.core.config import Settings

    need = min_n_ctx(Settings())
    r = edge("config", "set", "n_ctx", str(need - 1))
    assert r.returncode == 2 and f"at least {need}, not {need - 1}" in r.stderr
    assert edge("config", "set", "n_ctx", str(need)).returncode == 0
    r = edge("config", "set", "system_prompt", "Answer in one word. " * 200)
    assert r.returncode == 2 and "n_ctx must be at least" in r.stderr


def test_a_bad_value_in_the_file_is_refused_when_read(edge_home):
    """A file edited by hand: the command says which setting and its range (and `config set` fixes it)."""
    (edge_home / "config.toml").write_text('theme = "nosuchtheme"\nseprod_tau = 3.0\n')
    r = edge("config", "show")
    assert r.returncode == 2 and "theme must be empty" in r.stderr
    assert edge("config", "set", "theme", "nord").returncode == 2  # seprod_tau is still bad: named
    r = edge("config", "set", "seprod_tau", "0.1")
    assert r.returncode == 2 and "theme" in r.stderr


def test_themes_are_textuals():
    """config.THEMES (config cannot import Textual) is Textual's list of built-in themes."""
    from textual.theme import BUILTIN_THEMES

    from edge_agent.core.config import THEMES

    assert THEMES == set(BUILTIN_THEMES)


def test_config_file_header_points_to_config_explain(edge_home):
    assert edge("config", "set", "mode", "freeform").returncode == 0
    header = (edge_home / "config.toml").read_text().splitlines()[0]
    assert header.startswith("#") and "edge-agent config explain" in header


@pytest.mark.asyncio
async def test_settings_screen_refuses_values_that_cannot_work(edge_home):
    """The app's settings screen applies the same validation, range in the message; nothing saved."""
    from edge_agent.core.config import Settings
    from edge_agent.ui.screens.settings import SettingsScreen
    from tests.pilot import ScreenHost

    settings = Settings.load()
    app = ScreenHost(lambda: SettingsScreen(settings))
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        for field, bad, says in [("temperature", "-1", "between 0 and 5"),
                                 ("seprod_tau", "2", "between 0 and 1"),
                                 ("searxng_url", "notaurl", "http:// or https://")]:
            screen.query_one(f"#f-{field}").value = bad
            screen.action_save()
            await pilot.pause()
            assert isinstance(app.screen, SettingsScreen) and not app.result
            assert any(says in n.message and field in n.message for n in app._notifications), field
            screen.query_one(f"#f-{field}").value = str(getattr(Settings(), field))
    assert not (edge_home / "config.toml").exists()


# --- item 15: downloads with the network down; models verify ------------------------------------------
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_pull_with_the_network_down_fails_at_once(edge_home, monkeypatch):
    """Nothing listening at HF_ENDPOINT: the pull fails in under 2 s with the default retry policy (it
    used to retry a connection that never opened for ~7 s), and the command says what to check."""
    from edge_agent.core.config import Settings
    from edge_agent.core.errors import DownloadError
    from edge_agent.modelfiles import pull as model_pull
    from edge_agent.modelfiles.catalog import load_catalog

    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(DownloadError):
        model_pull.pull(load_catalog().get("qwen3-vl-2b-instruct"), Settings.load())
    assert time.monotonic() - t0 < 2.0
    r = edge("models", "pull", "qwen3-vl-2b-instruct", env={"HF_ENDPOINT": url})
    assert r.returncode == 2 and url.split("//")[1] in r.stderr and "Traceback" not in r.stderr


def test_models_verify_says_a_mismatch_once_and_not_gguf_for_a_jpeg(edge_home, tiny_models, image):
    r = edge("models", "verify", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj_mismatch"]))
    assert r.returncode == 2 and (r.stdout + r.stderr).count("embeddings 192 wide") == 1, r.stdout + r.stderr
    assert "x pairing" in r.stdout
    jpeg = image.with_suffix(".jpg")
    Image.open(image).convert("RGB").save(jpeg)
    r = edge("models", "verify", str(jpeg))
    assert (r.returncode == 2 and "not a GGUF model file" in r.stderr
            and (r.stdout + r.stderr).count("not a GGUF model file") == 1)


# --- item 16: HEIC photos -----------------------------------------------------------------------------
def test_ask_about_a_heic_photo(env, tiny_models, tmp_path):
    """An iPhone photo (HEIC, written by pillow-heif) is read and reaches the model."""
    from tests.files import write_heic

    heic = write_heic(tmp_path / "IMG_0003.HEIC")
    r = edge("ask", str(heic), "What colour is it?", *tiny(tiny_models), "--offline", "--json")
    assert r.returncode in (0, 1), r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    seen = next(row for row in rows if row["event"] == "image_evaluated" and row["source"] == "image")
    assert seen["tokens"] > 0 and rows[0]["image"] == str(heic)


# --- item 11: damaged history is recovered ---------------------------------------------------------------




@pytest.mark.parametrize("how, at_least",
                         [("truncated", 15), ("zeroed header", 40), ("page in the middle", 30)])
def test_a_damaged_chat_history_is_set_aside_and_salvaged(edge_home, how, at_least):
    """`edge-agent chats` on a damaged file: the file is kept aside byte for byte, the readable chats
    are listed from a new file, and what happened is said once (the next run says nothing)."""
    path = chats_file(edge_home)
    damaged = damage(path, how)
    r = edge("chats", "--limit", "100")
    assert r.returncode == 0, r.stderr
    listed = [line for line in r.stdout.splitlines() if "Question" in line]
    assert len(listed) >= at_least, (how, len(listed), r.stderr)
    asides = list(edge_home.glob("chats.sqlite3.damaged-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == damaged
    assert r.stderr.count("was damaged") == 1 and f"kept as {asides[0]}" in r.stderr
    assert "Recovered" in r.stderr
    again = edge("chats", "--limit", "100")
    assert again.returncode == 0 and "damaged" not in again.stderr and again.stdout == r.stdout
    shown = edge("chats", "show", listed[0].split()[0])
    assert shown.returncode == 0 and "Answer" in shown.stdout


def test_ask_continues_after_the_history_was_recovered(env, tiny_models, image):
    """`ask` on a damaged history starts (saying so once) and saves its chat in the new file."""
    damage(chats_file(env, 10), "zeroed header")
    r = edge("ask", str(image), "What colour?", *tiny(tiny_models), "--offline")
    assert r.returncode in (0, 1), r.stderr
    assert r.stderr.count("was damaged") == 1
    listed = edge("chats", "--limit", "100").stdout.splitlines()
    assert len(listed) == 11 and "What colour?" in listed[0]


def test_a_damaged_config_file_is_set_aside_and_defaults_used(edge_home):
    """config.toml that is not TOML: commands run on the defaults, say so once, keep the file."""
    (edge_home / "config.toml").write_text('mode = "freeform"\nthis is not toml [\n')
    r = edge("config", "show", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "ssr"
    asides = list(edge_home.glob("config.toml.damaged-*"))
    assert len(asides) == 1 and "not toml" in asides[0].read_text()
    assert r.stderr.count("could not be read") == 1 and str(asides[0]) in r.stderr and "default" in r.stderr
    assert not (edge_home / "config.toml").exists()
    assert edge("config", "set", "mode", "freeform").returncode == 0
    r = edge("config", "show", "--json")
    assert json.loads(r.stdout)["mode"] == "freeform" and r.stderr == ""


def test_a_damaged_search_cache_is_set_aside_and_salvaged(edge_home):
    """The search cache with a damaged page: `cache stats` works on what was salvaged, says so, keeps it."""
    from edge_agent.tools.cache import CacheEntry, SearchCache

    cache = SearchCache(edge_home / "search-cache.sqlite3")
    for i in range(60):
        cache.put(CacheEntry(tool="text_search", backend="wikipedia", query=f"q{i}", image_sha256="",
                             params={},
                             results=[{"title": "t" * 500, "url": "https://e.org", "snippet": "s" * 500}]))
    damaged = damage(edge_home / "search-cache.sqlite3", "page in the middle")
    r = edge("cache", "stats", "--json")
    assert r.returncode == 0, r.stderr
    assert 40 <= json.loads(r.stdout)["entries"] < 60
    asides = list(edge_home.glob("search-cache.sqlite3.damaged-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == damaged and r.stderr.count("was damaged") == 1


def test_eval_predictions_carry_no_control_characters(edge_home, tiny_models, tmp_path):
    """`eval` with the tiny model sampled hot: the stored predictions and the report are clean (item 8)."""
    from scripts.make_synthetic_vqa import make_dataset

    data = make_dataset(tmp_path / "svqa", n=4, seed=0, size=(200, 150))
    out = tmp_path / "out"
    hot = {**{f"EDGE_AGENT_{k}": v for k, v in SMALL.items()}, "EDGE_AGENT_TEMPERATURE": "1.5"}
    r = edge("eval", str(data), "--modes", "ssr", "--out", str(out), "--offline", *tiny(tiny_models), env=hot,
             timeout=300)
    assert r.returncode in (0, 1), r.stderr
    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".md", ".txt")]
    assert written
    rows = [json.loads(line) for line in next(out.glob("*.jsonl")).read_text().splitlines()]
    assert rows and any(row["prediction"] for row in rows)
    for p in written:
        assert not CONTROLS.search(p.read_text(encoding="utf-8").replace("\n", "")), p
