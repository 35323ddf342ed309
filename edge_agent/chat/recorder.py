"""One exchange of a chat, recorded in the chat store: the app and `edge-agent ask` write it the same way.

Knows: the order an exchange is written in (a new chat when there is none yet, the question and its images,
the answer, each event of the answer as it comes, the answer's status at the end) and, in
:class:`AnswerStatus`, the one derivation of that status: the FinalAnswer's stop reason; a fatal
AgentError: ``error`` (with its title and message); a run that ends without either: ``cancelled`` when it
was cancelled, else ``answered``; an EdgeAgentError or a bug: ``error``; ``Cancelled``: ``cancelled``.

When the exchange is written (:meth:`ExchangeRecorder.open`), for the app and `ask` alike: once the
question reached the model, the first event after ``RunStarted`` that is not a fatal error; a question
refused before that (a bad image, an image for a text-only model, a busy engine) adds nothing, not even an
empty chat. What the question continues from is read before, without writing
(``ChatStore.continuation(chat_id, replace_last=...)``); the app shows the question at once, keys its
running answer by its own id until the exchange is written, and claims a new chat's lock when the chat
is made (``on_new_chat``).
Does not know: the engine, widgets, the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edge_agent.agent import events as ev
from edge_agent.core.errors import Cancelled, EdgeAgentError

if TYPE_CHECKING:
    from edge_agent.chat.store import ChatStore


class AnswerStatus:
    """An answer's status from its events (``see``) and how its run ended (``end``, ``failed``)."""

    def __init__(self) -> None:
        self.status, self.title, self.message = "", "", ""

    def see(self, event: ev.Event) -> None:
        if isinstance(event, ev.FinalAnswer):
            self.status = event.stop_reason
        elif isinstance(event, ev.AgentError) and event.fatal:
            self.status, self.title, self.message = "error", event.title, event.message

    def end(self, *, cancelled: bool) -> str:
        """The status of a run whose events all arrived."""
        if not self.status:
            self.status = "cancelled" if cancelled else "answered"
        return self.status

    def failed(self, e: BaseException) -> str:
        """The status of a run that raised ``e`` (a bug keeps the chat: ``error``)."""
        if isinstance(e, Cancelled | KeyboardInterrupt):
            self.status = "cancelled"
        elif isinstance(e, EdgeAgentError):
            self.status, self.title, self.message = "error", e.title, e.message
        else:
            self.status = "error"
        return self.status


class ExchangeRecorder:
    """Writes one question and its answer into chat ``chat_id`` (None or 0: a new chat, made on open, then
    handed to ``on_new_chat``)."""

    def __init__(self, store: ChatStore | None, chat_id: int | None, question: str, images: Sequence[str],
                 files: dict[str, str], *, replace_last: bool = False,
                 on_new_chat: Callable[[int], object] | None = None) -> None:
        self.store, self.chat_id, self.question = store, chat_id or None, question
        self.images, self.files, self.replace_last = list(images), files, replace_last
        self.on_new_chat = on_new_chat
        self.message_id: int | None = None  # the answer's, once written
        self._held: list[ev.Event] = []

    def open(self) -> int:
        """Write the exchange: a new chat if needed, the question (taking the place of the last exchange
        when ``replace_last``), the running answer and the events held until now."""
        assert self.store is not None
        if self.message_id is None:
            if self.chat_id is None:
                self.chat_id = self.store.new_chat()
                if self.on_new_chat is not None:
                    self.on_new_chat(self.chat_id)
            self.store.add_user_message(self.chat_id, self.question, self.images,
                                        replace_last=self.replace_last)
            self.message_id = self.store.start_answer(self.chat_id, models=self.files)
            for held in self._held:
                self.store.add_event(self.message_id, held)
            self._held = []
        return self.message_id

    def add(self, e: ev.Event) -> None:
        """Store one event; the exchange opens on the first that shows the model read the question."""
        if self.store is None:
            return
        if self.message_id is None and (isinstance(e, ev.RunStarted) or (isinstance(e,
                ev.AgentError) and e.fatal)):
            self._held.append(e)  # not yet: the run may stop here without the model reading anything
            return
        self.store.add_event(self.open(), e)

    def finish(self, status: str) -> None:
        if self.store is not None and self.message_id is not None:
            self.store.finish_answer(self.message_id, status)
