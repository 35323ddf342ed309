"""Issue 23 (the second hour without surprises), the app's side of ux2's items: a cancelled download
stops at once, HEIC photos open in the picker, /image and zoom, damaged history is recovered.

Real parts: the app under Textual's Pilot, a loopback hub (tests/fakehub.py), real SQLite and image files.
"""

from __future__ import annotations

import time

import pytest
from textual.app import App
from textual.widgets import Static

from edge_agent.config import Settings
from tests.waits import pilot_wait_until

REPO = "Qwen/Qwen3-VL-2B-Instruct-GGUF"


class _Host(App):
    """One screen pushed on an empty app; ``result`` gets what it is dismissed with."""

    def __init__(self, make_screen) -> None:
        super().__init__()
        self.make_screen = make_screen
        self.result: list = []

    def on_mount(self) -> None:
        self.push_screen(self.make_screen(), self.result.append)


# --- item 15: a cancelled download says so at once --------------------------------------------------
@pytest.mark.asyncio
async def test_esc_cancels_a_stalled_download_at_once(edge_home, tiny_models, monkeypatch):
    """The hub sends 4 kB and then nothing (the connection stays open): Esc ends the download within a
    second as "cancelled" (it used to wait for the 30-s read timeout and a retry); the part stays."""
    from edge_agent.hub import HubClient
    from edge_agent.ui.download import DownloadScreen
    from tests.fakehub import FakeHub

    name = "Qwen3VL-2B-Instruct-Q4_K_M.gguf"
    with FakeHub() as hub:
        hub.add_file(REPO, name, tiny_models["text_q8_0"].read_bytes())
        hub.add_file(REPO, "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf", tiny_models["mmproj"].read_bytes())
        hub.stall_after[name] = 4096
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        app = _Host(lambda: DownloadScreen(Settings.load(), hub_client=HubClient()))
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
