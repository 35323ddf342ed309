"""The chat list (search, resume, rename, delete, export) and the small rename dialog.

Delete asks first: ``d`` arms it for the highlighted chat, a second ``d`` deletes, anything else
(another chat, Esc) disarms it. Typing in the search box (``/`` focuses it) narrows the list to the chats
whose title or messages hold the words (``ChatStore.search``: full text), each with where it was said.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from edge_agent.chat.lock import ChatBusy, ChatLock
from edge_agent.chat.store import ChatStore, ChatSummary


@dataclass(frozen=True)
class ChatAction:
    """What the user chose in the list: ``action`` in resume | export | new; ``chat_id`` for the first two."""

    action: str
    chat_id: int | None = None


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    RenameScreen { align: center middle; }
    RenameScreen Vertical { width: 60; height: auto; border: thick $accent; background: $surface;
                            padding: 1; }
    """

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old = title

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Rename chat (Enter saves, Esc cancels)")
            yield Input(self.old, id="new-title")

    @on(Input.Submitted)
    def done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class ChatsScreen(ModalScreen[ChatAction | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("enter", "resume", "Resume", show=True),
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
        Binding("slash", "search", "Search"),
    ]
    DEFAULT_CSS = """
    ChatsScreen { align: center middle; }
    ChatsScreen #chats { width: 90; max-width: 100%; height: 80%; border: thick $accent;
                         background: $surface; }
    ChatsScreen OptionList { height: 1fr; border: none; }
    ChatsScreen #chats-help { color: $text-muted; padding: 0 1; }
    ChatsScreen #chat-search { border: none; height: 1; margin: 0 1; }
    """

    def __init__(self, store: ChatStore, current: int | None, home: Path | None = None) -> None:
        super().__init__()
        self.store = store
        self.home = home  # where the chats' locks are: a chat being answered is not deleted
        self.current = current
        self.chats: list[ChatSummary] = []
        self.query_text = ""
        self.armed: int | None = None  # the chat a first `d` asked to delete

    def compose(self) -> ComposeResult:
        with Vertical(id="chats"):
            yield Static("[b]Chats[/b]", id="chats-title")
            yield Input(placeholder="/ search the chats (titles and what was said)", id="chat-search")
            yield OptionList(id="chat-list")
            yield Static("Enter resume · / search · n new · r rename · d delete · e export · Esc close",
                         id="chats-help")
        yield Footer()

    def on_mount(self) -> None:
        self.reload()

    def reload(self, highlight: int | None = None, *, focus_list: bool = True) -> None:
        words = self.query_text.casefold().split()
        found = self.store.search(self.query_text) if words else {}  # the messages' texts (full-text search)
        self.chats = [c for c in self.store.list_chats()
                      if c.id in found or all(w in c.title.casefold() for w in words)]
        ol = self.query_one(OptionList)
        ol.clear_options()
        for c in self.chats:
            t = Text()
            t.append("● " if c.id == self.current else "  ", style="green")
            t.append(c.title, style="bold")
            t.append(f"  {c.n_messages} messages · {when(c.updated)}", style="dim")
            if c.id in found:
                t.append(f"\n    {found[c.id]}", style="italic")
            ol.add_option(Option(t, id=str(c.id)))
        if not self.chats:
            empty = f"No chat has {self.query_text!r}." if words else "No chats yet. Press n to start one."
            ol.add_option(Option(Text(empty, style="dim"), disabled=True))
        elif highlight is not None and highlight < len(self.chats):
            ol.highlighted = highlight
        else:
            ol.highlighted = 0
        if focus_list:
            ol.focus()

    def selected(self) -> ChatSummary | None:
        i = self.query_one(OptionList).highlighted
        return self.chats[i] if i is not None and 0 <= i < len(self.chats) else None

    @on(OptionList.OptionSelected)
    def action_resume(self) -> None:
        c = self.selected()
        if c is not None:
            self.dismiss(ChatAction("resume", c.id))

    def action_new(self) -> None:
        self.dismiss(ChatAction("new"))

    def action_export(self) -> None:
        c = self.selected()
        if c is not None:
            self.dismiss(ChatAction("export", c.id))

    def action_search(self) -> None:
        self.query_one("#chat-search", Input).focus()

    @on(Input.Changed, "#chat-search")
    def search_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value
        self.armed = None
        self.reload(focus_list=False)  # typing goes on in the search box

    @on(Input.Submitted, "#chat-search")
    def search_done(self) -> None:
        self.query_one(OptionList).focus()

    @on(OptionList.OptionHighlighted)
    def moved(self) -> None:
        c = self.selected()
        if self.armed is not None and (c is None or c.id != self.armed):
            self.armed = None  # moving to another chat cancels a pending delete

    def action_delete(self) -> None:
        c = self.selected()
        if c is None:
            return
        if self.armed != c.id:
            self.armed = c.id
            self.notify(f"Press d again to delete {c.title!r} and its {c.n_messages} messages for good.",
                        title="Delete chat?", severity="warning", timeout=5)
            return
        self.armed = None
        i = self.query_one(OptionList).highlighted or 0
        lock = (ChatLock(self.home, c.id, "edge-agent (the app)").holding(timeout=0) if self.home is not None
                else contextlib.nullcontext())
        try:  # not while it is answered: this app's answer, or `ask --chat` elsewhere
            with lock:
                self.store.delete(c.id)
        except ChatBusy as e:
            self.notify(e.message, title=e.title, severity="warning", timeout=8)
            return
        self.notify(f"Deleted {c.title!r}.", title="Chat deleted")
        if c.id == self.current:
            self.current = None
        self.reload(highlight=max(0, i - 1))

    def action_rename(self) -> None:
        c = self.selected()
        if c is None:
            return
        i = self.query_one(OptionList).highlighted or 0

        def done(title: str | None) -> None:
            if title:
                self.store.rename(c.id, title)
                self.reload(highlight=i)

        self.app.push_screen(RenameScreen(c.title), done)
