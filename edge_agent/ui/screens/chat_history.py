"""The chat screen's chats: a new chat, a stored chat opened a page at a time, the chats list, export.

A base class of :class:`edge_agent.ui.screens.chat.ChatScreen` (it uses the screen's ``host``, ``store``,
its transcript, images and prompt). A stored chat shows its last ``OPEN_PAGE`` messages at once; older ones
are mounted a page at a time when the person scrolls to the top or presses the "earlier messages" line.
Knows: the chat store's chats and messages as widgets, the export's files. Does not know: how a question is
asked or an answer rendered live (``chat.py``), the engine, the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.message import Message as UIMessage
from textual.widget import Widget
from textual.widgets import Static

from edge_agent.chat import export as chat_export
from edge_agent.chat.store import Chat, ChatStore, Message
from edge_agent.core.errors import EdgeAgentError
from edge_agent.ui.screens.images import ImageActions
from edge_agent.ui.widgets.prompt import PromptInput
from edge_agent.ui.widgets.transcript import AnswerView, Transcript, UserMessage

OPEN_PAGE = 8  # messages a stored chat shows at first, and per step back (4 questions and answers)


class EarlierMessages(Static):
    """The top line of a long chat: older messages are mounted when it is clicked or scrolled to."""

    DEFAULT_CSS = """
    EarlierMessages { width: 100%; height: 1; background: $boost; color: $text-muted; text-align: center; }
    """

    class Pressed(UIMessage):
        pass

    def __init__(self, n: int) -> None:
        super().__init__(self._label(n), classes="earlier-messages")

    @staticmethod
    def _label(n: int) -> str:
        return f"▲ {n} earlier messages (scroll up or click to show)"

    def set_count(self, n: int) -> None:
        self.update(self._label(n))

    def on_click(self) -> None:
        self.post_message(self.Pressed())


class ChatHistory(ImageActions):
    """New, open, page back through and export chats: the chat screen's chats (its base class)."""

    store: ChatStore
    chat_id: int | None
    running: int | None
    reasoning_open: bool
    text_only: bool
    _replace_last: bool
    _older: list[tuple[Message, list[str]]]

    if TYPE_CHECKING:  # the chat screen's
        def empty_hint(self) -> str: ...

        async def action_cancel(self) -> None: ...

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)


    # --- chats ---
    def action_chats(self) -> None:
        from edge_agent.ui.screens.chats import ChatAction, ChatsScreen

        async def chosen(choice: ChatAction | None) -> None:
            if self.chat_id is not None:
                self.sub_title = self.store.load_title(self.chat_id) or "new chat"  # it may have been renamed
            if choice is None:
                if self.chat_id is not None and not any(c.id == self.chat_id
                                                        for c in self.store.list_chats()):
                    await self.new_chat()  # the open chat was deleted
                return
            if choice.action == "new":
                await self.new_chat()
            elif choice.action == "resume" and choice.chat_id is not None:
                await self.open_chat(self.store.load(choice.chat_id))
            elif choice.action == "export":
                self.export(choice.chat_id)

        self.app.push_screen(ChatsScreen(self.store, self.chat_id, self.host.settings.home), chosen)

    async def action_new_chat(self) -> None:
        await self.new_chat()

    async def new_chat(self) -> None:
        if self.running is not None:
            await self.action_cancel()
        self.chat_id, self.attached, self.images, self.sent = None, [], [], False
        self._replace_last, self._older = False, []
        self.transcript.restart()
        await self.transcript.remove_children()
        await self.transcript.mount(Static(self.empty_hint(), classes="empty-hint"))
        self.sub_title = "new chat"
        self._show_images()
        self.query_one(PromptInput).focus()  # Ctrl+N from anywhere: typing goes to the new chat

    async def open_chat(self, chat: Chat) -> None:
        """Show a stored chat and continue it (its last image stays attached).

        Only the last ``OPEN_PAGE`` messages are built and mounted now; older ones are mounted a page at a
        time when the user scrolls to the top (or presses the "earlier messages" line), so a chat of any
        length opens at once."""
        if self.running is not None:
            await self.action_cancel()
        self.transcript.restart()
        await self.transcript.remove_children()
        self.chat_id = chat.id
        self._replace_last = False
        self.sub_title = chat.title
        images: list[str] = []
        staged: list[tuple[Message, list[str]]] = []
        for m in chat.messages:
            if m.role == "user":
                images = m.images or images
            staged.append((m, images))
        cut = max(0, len(staged) - OPEN_PAGE)
        if cut and staged[cut][0].role != "user":
            cut -= 1  # a page starts with a question
        self._older = staged[:cut]
        widgets: list[Widget] = [await self._message_widget(m, img) for m, img in staged[cut:]]
        if self._older:
            widgets.insert(0, EarlierMessages(len(self._older)))
        await self.transcript.mount_all(widgets)
        self.images = []
        for p in chat.images:
            if p not in self.images:
                self.images.append(p)
        self.attached, self.sent = ([] if self.text_only else list(images)), bool(images)
        self._show_images()
        self.transcript.scroll_end(animate=False)
        # The chat's context is restored (in the background, while the question is typed), not read
        # again; its photo matters only to the prophet, which then decodes the agent's embedding instead
        # of encoding it itself (in the answer's way).
        self.read_ahead()
        for image in images if self.host.drafting else ():
            self.host.prepare_image(image)

    async def _message_widget(self, m: Message, images: list[str]) -> UserMessage | AnswerView:
        """One stored message as its widget, built unmounted (mounted in one go with its page)."""
        if m.role == "user":
            return UserMessage(m.text, m.images, replaced=m.replaced)
        view = AnswerView(m.id, images, collapse_when_done=not self.reasoning_open, replaced=m.replaced)
        await view.replay(m.events, m.status, m.text)
        if self.reasoning_open:
            view.set_expanded(True)
        return view

    async def show_earlier(self) -> None:
        """Mount the previous page of a long chat above what is shown, keeping the view where it was."""
        if not self._older:
            return
        marker = next(iter(self.transcript.query(EarlierMessages)), None)
        cut = max(0, len(self._older) - OPEN_PAGE)
        if cut and self._older[cut][0].role != "user":
            cut -= 1
        page, self._older = self._older[cut:], self._older[:cut]
        widgets = [await self._message_widget(m, img) for m, img in page]
        first = next((c for c in self.transcript.children if not isinstance(c, EarlierMessages)), None)
        before_height = self.transcript.virtual_size.height
        if first is not None:
            await self.transcript.mount_all(widgets, before=first)
        else:
            await self.transcript.mount_all(widgets)
        if marker is not None:
            if self._older:
                marker.set_count(len(self._older))
            else:
                await marker.remove()
        self.call_after_refresh(lambda: self.transcript.scroll_to(
            y=self.transcript.scroll_y + max(0, self.transcript.virtual_size.height - before_height),
            animate=False))

    @on(Transcript.ReachedTop)
    async def reached_top(self) -> None:
        await self.show_earlier()

    @on(EarlierMessages.Pressed)
    async def earlier_pressed(self) -> None:
        await self.show_earlier()

    def action_export(self) -> None:
        self.export(self.chat_id)

    def export(self, chat_id: int | None, directory: str | None = None) -> None:
        if chat_id is None:
            self.notify("Nothing to export yet: ask a question first.", title="Empty chat",
                        severity="warning")
            return
        target = Path(directory).expanduser() if directory else self.host.settings.home / "exports"
        try:
            md, js = chat_export.export(self.store, chat_id, target)
        except EdgeAgentError as e:
            self.notify(e.message, title=e.title, severity="error")
            return
        self.notify(f"{md}\n{js}", title="Chat exported", timeout=8)
