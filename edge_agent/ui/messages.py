"""Messages that engine worker threads post to the UI (``post_message`` is thread-safe).

The workers never touch widgets; the UI never calls the engine on its own thread.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from edge_agent.agent.events import Event


class EngineProgress(Message):
    """Model loading: ``text`` says what, ``fraction`` in [0, 1] (or -1 when unknown)."""

    def __init__(self, text: str, fraction: float) -> None:
        super().__init__()
        self.text, self.fraction = text, fraction


class EngineReady(Message):
    """``gen``: which load this was (a newer load makes this engine stale)."""

    def __init__(self, engine: Any, seconds: float, gen: int = 0) -> None:
        super().__init__()
        self.engine, self.seconds, self.gen = engine, seconds, gen


class EngineFailed(Message):
    """Loading failed with a user-fixable error (title + message); ``no_model``: show the first-run screen."""

    def __init__(self, title: str, message: str, no_model: bool, gen: int = 0) -> None:
        super().__init__()
        self.title, self.message, self.no_model, self.gen = title, message, no_model, gen


class AgentEvent(Message):
    """One agent event of the answer stored as message ``message_id``."""

    def __init__(self, message_id: int, event: Event) -> None:
        super().__init__()
        self.message_id, self.event = message_id, event


class AskFinished(Message):
    """The ask worker is done. ``status``: answered | turn_limit | cancelled | error."""

    def __init__(self, message_id: int, status: str, title: str = "", message: str = "") -> None:
        super().__init__()
        self.message_id, self.status, self.title, self.message = message_id, status, title, message
