"""The app with files: a cancelled download stops at once, HEIC photos open in the picker, /image and
zoom, a damaged chat history is recovered.

Real parts: the app under Textual's Pilot, a loopback hub (tests/fakes/hub.py), real SQLite and image files.
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Static

from edge_agent.core.config import Settings
from tests.files import write_heic
from tests.pilot import ScreenHost
from tests.waits import pilot_wait_until

REPO = "Qwen/Qwen3-VL-2B-Instruct-GGUF"


# --- item 15: a cancelled download says so at once --------------------------------------------------
@pytest.mark.asyncio
async def test_esc_cancels_a_stalled_download_at_once(edge_home, tiny_models, monkeypatch):
    """The hub sends 4 kB and then nothing (the connection stays open): Esc ends the download within a
    second as "cancelled" (it used to wait for the 30-s read timeout and a retry); the part stays."""
    from edge_agent.modelfiles.hub import HubClient
    from edge_agent.ui.screens.download import DownloadScreen
    from tests.fakes.hub import FakeHub

    name = "Qwen3VL-2B-Instruct-Q4_K_M.gguf"
    with FakeHub() as hub:
        hub.add_file(REPO, name, tiny_models["text_q8_0"].read_bytes())
        hub.add_file(REPO, "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf", tiny_models["mmproj"].read_bytes())
        hub.stall_after[name] = 4096
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        app = ScreenHost(lambda: DownloadScreen(Settings.load(), hub_client=HubClient()))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, DownloadScreen)
            await pilot.press("enter")  # the first entry: qwen3-vl-2b-instruct
            part = Settings.load().models_dir / "Qwen--Qwen3-VL-2B-Instruct-GGUF" / (name + ".part")
            await pilot_wait_until(pilot, lambda: name not in hub.stall_after and part.exists(), timeout=20,
                                   what="the stall")
            await pilot.pause(0.3)
            t0 = time.monotonic()
            await pilot.press("escape")
            await pilot_wait_until(pilot, lambda: screen.running is None, timeout=10, what="the cancel")
            took = time.monotonic() - t0
            status = str(screen.query_one("#dl-status", Static).render())
            assert "cancelled" in status and "resume" in status and took < 1.5, (took, status)
        assert part.exists()


# --- item 16: HEIC/HEIF photos --------------------------------------------------------------------------


def test_heic_loads_crops_and_exports_as_jpeg(edge_home, tmp_path):
    """The loader reads a HEIC (size, colour); a zoom crops it; an export links a JPEG copy (Markdown
    viewers do not show HEIC)."""
    from edge_agent.agent import events as ev
    from edge_agent.chat import export as chat_export
    from edge_agent.chat.store import ChatStore
    from edge_agent.tools.images import SUFFIXES, load_image
    from edge_agent.tools.zoom import ImageStore

    heic = write_heic(tmp_path / "IMG_0001.HEIC")
    loaded = load_image(heic)
    assert loaded.format == "HEIF" and loaded.size == (96, 64)
    r, g, b = loaded.image.getpixel((48, 32))
    assert r > 150 and g < 80 and b < 80
    assert {".heic", ".heif"} <= set(SUFFIXES)
    store = ImageStore(loaded.image, crops_dir=tmp_path / "crops")
    crop = store.zoom([0, 0, 500, 500])  # the photo's top-left quarter
    assert (len(store.images) == 2 and crop.image.image.size == (48, 32)
            and crop.image.image.getpixel((10, 10))[0] > 150)
    chats = ChatStore(edge_home / "chats.sqlite3")
    try:
        cid = chats.new_chat()
        chats.add_user_message(cid, "What colour?", str(heic))
        chats.add_event(chats.start_answer(cid),
                        ev.FinalAnswer(answer="Red.", turns=1, stop_reason="answered"))
        md_path, _ = chat_export.export(chats, cid, tmp_path / "out")
    finally:
        chats.close()
    copies = list(md_path.with_name(md_path.stem + "_files").iterdir())
    assert [c.suffix for c in copies] == [".jpg"] and copies[0].name in md_path.read_text()
    assert load_image(copies[0]).format == "JPEG"


@pytest.mark.asyncio
async def test_heic_in_the_picker_preview_and_asked_in_the_app(edge_home, tiny_models, tmp_path):
    """The picker lists the HEIC (and not a .xyz), previews it as a picture, and the real engine
    answers a question about it (the image reached the model)."""
    from textual.widgets import DirectoryTree

    from edge_agent.agent import events as ev
    from edge_agent.ui.app import EdgeAgentApp
    from edge_agent.ui.screens.picker import ImagePickerScreen
    from edge_agent.ui.widgets.preview import ImagePreview
    from tests.pilot import settle, type_and_enter

    folder = tmp_path / "photos"
    folder.mkdir()
    heic = write_heic(folder / "IMG_0002.heic")
    (folder / "notes.xyz").write_text("not an image")
    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "offline": True, "n_threads": 1, "n_threads_batch": 1, "n_ctx": 4096,
                              "answer_max_tokens": 6, "max_turns": 1})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.push_screen(ImagePickerScreen(folder))
        await pilot.pause(0.5)
        picker = app.screen
        tree = picker.query_one(DirectoryTree)
        await pilot_wait_until(pilot, lambda: len(tree.root.children) > 0, what="the folder listing")
        assert [n.label.plain for n in tree.root.children] == ["IMG_0002.heic"]
        preview = picker.query_one("#picker-preview", ImagePreview)
        preview.show(heic)
        await pilot.pause()
        shown = str(preview.render())
        assert "not an image" not in shown and "cannot" not in shown and preview.path == str(heic)
        await pilot.press("escape")
        await type_and_enter(pilot, f"/image {heic}")
        await type_and_enter(pilot, "What colour is it?")
        await settle(pilot)
        chat = app.store.load(app.chat_screen.chat_id)
        events = [e for m in chat.messages for e in m.events]
        assert any(isinstance(e, ev.ImageEvaluated) and e.source == "image" for e in events), \
            [n.message for n in app._notifications]
        assert next(e for e in events if isinstance(e, ev.RunStarted)).image == str(heic.resolve())


# --- item 11: the app starts on recovered files -------------------------------------------------------
@pytest.mark.asyncio
async def test_the_app_starts_on_a_recovered_history_and_says_so_once(edge_home, tmp_path):
    """A damaged chats.sqlite3, config.toml and search cache: the app opens, lists the salvaged chats,
    and says once for each what was recovered and where the original is kept."""
    from edge_agent.core.recovery import take_notices
    from tests.files import chats_file, damage
    from tests.pilot import scripted_app, settle

    take_notices()  # nothing left over from another test in this process
    damage(chats_file(edge_home, 12), "page in the middle")
    (edge_home / "config.toml").write_text("mode = [\n")
    (edge_home / "search-cache.sqlite3").write_bytes(b"\x00garbage" * 500)
    app, _ = scripted_app(Settings.load(), tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot_wait_until(pilot, lambda: sum("damaged" in n.message or "could not be read" in n.message
                                                  for n in app._notifications) == 3, what="three notices")
        said = [n.message for n in app._notifications if n.title == "Recovered a damaged file"]
        assert len(said) == 3
        chats = next(m for m in said if "chat history" in m)
        assert ("Recovered 12 chats" in chats
                and f"kept as {next(edge_home.glob('chats.sqlite3.damaged-*'))}" in chats)
        assert len(app.store.list_chats()) == 12
        await pilot.pause(0.2)
        assert len([n for n in app._notifications if n.title == "Recovered a damaged file"]) == 3  # once each
    assert take_notices() == []
