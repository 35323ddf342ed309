"""Messages that engine worker threads post to the UI (``post_message`` is thread-safe).

The workers never touch widgets; the UI never calls the engine on its own thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

from edge_agent.agent.events import Event

if TYPE_CHECKING:
    from edge_agent.engine.face import EngineFace


class EngineProgress(Message):
    """Model loading: ``text`` says what, ``fraction`` in [0, 1] (or -1 when unknown)."""

    def __init__(self, text: str, fraction: float) -> None:
        super().__init__()
        self.text, self.fraction = text, fraction


class EngineReady(Message):
    """``gen``: which load this was (a newer load makes this engine stale)."""

    def __init__(self, engine: EngineFace, seconds: float, gen: int = 0) -> None:
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


class HostChanged(Message):
    """The app to its chat screen: the engine host's state or settings changed (read them from the host).
    ``loading``: the loader's words and fraction while a model loads."""

    def __init__(self, loading: tuple[str, float] | None = None) -> None:
        super().__init__()
        self.loading = loading


class SettingsRequested(Message):
    """A screen asks the app to change settings (``changes``: field -> value)."""

    def __init__(self, changes: dict[str, Any]) -> None:
        super().__init__()
        self.changes = changes
