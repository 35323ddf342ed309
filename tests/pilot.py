"""The Pilot helpers every app test shares: ``settle``, ``type_and_enter``, the app with the scripted
engine (``scripted_app``) and one screen on an empty app (``ScreenHost``). Waiting on a condition:
tests/waits.py; the scripted engine: tests/fakes/engines.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import App
from textual.screen import Screen

from tests.fakes.engines import ScriptedEngine


async def settle(pilot, timeout: float = 120) -> None:
    """Wait until the app's workers are done and the screen has caught up (twice: a finished worker's
    message can start another one)."""
    async def _wait() -> None:
        for _ in range(2):
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()

    await asyncio.wait_for(_wait(), timeout)


async def type_and_enter(pilot, text: str) -> None:
    """Type ``text`` into the chat prompt and press Enter (a question, a /command or a pasted path)."""
    from edge_agent.ui.widgets.prompt import PromptInput

    prompt = pilot.app.screen.query_one(PromptInput)
    prompt.value = text
    prompt.focus()
    await pilot.press("enter")
    await pilot.pause()


def scripted_app(settings, tmp_path: Path, **kw):
    """(EdgeAgentApp whose engine factory makes ``ScriptedEngine(settings, tmp_path, **kw)``, the engines
    made)."""
    from edge_agent.ui.app import EdgeAgentApp

    made: list[ScriptedEngine] = []

    def factory(s, *, progress=None):
        if progress:
            progress("loading scripted engine", 0.5)
        made.append(ScriptedEngine(s, tmp_path, **kw))
        return made[-1]

    return EdgeAgentApp(settings, engine_factory=factory), made


class ScreenHost(App):
    """One screen pushed on an empty app; ``result`` gets what it is dismissed with."""

    def __init__(self, make_screen: Callable[[], Screen[Any]]) -> None:
        super().__init__()
        self.make_screen = make_screen
        self.result: list[Any] = []

    def on_mount(self) -> None:
        self.push_screen(self.make_screen(), self.result.append)
