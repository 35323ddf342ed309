"""The app's side of custom libraries: the settings screen picks (and validates) a library file,
and the reasoning view says which library scored a turn."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from edge_agent.agent import events as ev
from edge_agent.core.config import Settings
from edge_agent.ui.screens.settings import SettingsScreen
from edge_agent.ui.widgets.reasoning import rationale_table
from tests.fakes.engines import candidates
from tests.pilot import ScreenHost


def _head(e: ev.RationaleScored) -> str:
    console = Console(width=140, record=True, color_system=None)
    console.print(rationale_table(e))
    return console.export_text().splitlines()[0]


def test_reasoning_view_names_the_library():
    """The header names the file of a custom library, 'built-in' for the shipped one, nothing for
    events stored before the field existed."""
    base = dict(turn=1, candidates=candidates([0.2, 0.2, 0.2, 0.2, 0.1, 0.1], 0), chosen=0, seconds=0.05)
    assert "6 rationales from mine.json scored" in _head(
        ev.RationaleScored(**base, library="/home/u/libs/mine.json"))
    assert "6 rationales from built-in scored" in _head(ev.RationaleScored(**base, library="built-in"))
    assert "6 rationales scored in one pass" in _head(ev.RationaleScored(**base))


@pytest.mark.asyncio
async def test_settings_screen_picks_a_library_file_and_refuses_a_bad_one(edge_home, tmp_path):
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"rationales": [{"id": "a", "action": "answer", "text": "I can answer now"}]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rationales": [{"id": "z", "action": "zoom", "text": "I should zoom in"}]}))
    settings = Settings.load()
    app = ScreenHost(lambda: SettingsScreen(settings))
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#f-rationales").value = str(bad)
        screen.action_save()
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen) and not app.result  # refused
        assert any("no rationale with action" in n.message for n in app._notifications)
        screen.query_one("#f-rationales").value = str(good)
        screen.action_save()
        await pilot.pause()
    assert app.result and app.result[0] is not None and app.result[0].rationales == str(good)
