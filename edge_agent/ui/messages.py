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
    """One agent event of the answer to question ``ask_id`` (the screen's id for it: the answer is in the
    chat store only once the model read the question, see ``chat.recorder``)."""

    def __init__(self, ask_id: int, event: Event) -> None:
        super().__init__()
        self.ask_id, self.event = ask_id, event


class ExchangeOpened(Message):
    """Question ``ask_id`` reached the model and is written: in chat ``chat_id`` (made now for a question
    in a new chat), its answer as message ``message_id``. Posted before the event that opened it."""

    def __init__(self, ask_id: int, chat_id: int, message_id: int) -> None:
        super().__init__()
        self.ask_id, self.chat_id, self.message_id = ask_id, chat_id, message_id


class AskFinished(Message):
    """The ask worker of question ``ask_id`` is done. ``status``: answered | turn_limit | cancelled |
    error."""

    def __init__(self, ask_id: int, status: str, title: str = "", message: str = "") -> None:
        super().__init__()
        self.ask_id, self.status, self.title, self.message = ask_id, status, title, message


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
