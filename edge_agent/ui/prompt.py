"""The prompt: a one-line input with history (Up/Down) and the attached-image strip above it.

Slash commands are parsed here into values; the chat screen acts on them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Input, Static

SLASH_HELP = (
    "/image PATH  attach an image (or paste a path, or Ctrl+F); /image 2  the chat's 2nd image again\n"
    "/new  new chat   /chats  list chats   /export  export this chat\n"
    "/mode ssr|freeform   /offline on|off   /settings   /help"
)


@dataclass(frozen=True)
class Slash:
    name: str
    arg: str


def parse_slash(text: str) -> Slash | None:
    """``/image ~/a b.png`` -> Slash('image', '~/a b.png'); None when the text is not a command."""
    s = text.strip()
    if not s.startswith("/") or s.startswith("//"):
        return None
    name, _, arg = s[1:].partition(" ")
    if not name.isalpha():
        return None  # an absolute path such as /home/me/a.png is not a command
    arg = arg.strip()
    if arg[:1] in "'\"":
        try:
            arg = " ".join(shlex.split(arg))
        except ValueError:
            pass
    return Slash(name.lower(), arg)


class PromptInput(Input):
    """Enter submits; Up/Down walk through earlier questions (kept across chats)."""

    BINDINGS = [
        Binding("up", "history(-1)", "Previous", show=False),
        Binding("down", "history(1)", "Next", show=False),
    ]

    def __init__(self, history: list[str] | None = None, **kw) -> None:
        super().__init__(placeholder="Ask about your image…  (/image PATH attaches one; /help)", **kw)
        self.history: list[str] = list(history or [])
        self._pos = len(self.history)
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)
        self._draft = ""

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._draft = self.value
        self._pos = min(max(self._pos + step, 0), len(self.history))
        self.value = self.history[self._pos] if self._pos < len(self.history) else self._draft
        self.cursor_position = len(self.value)


class AttachmentBar(Static):
    """Which image the next question is about."""

    DEFAULT_CSS = """
    AttachmentBar { height: 1; padding: 0 1; color: $text-muted; }
    """

    def show(self, image: str | None, n_images: int) -> None:
        t = Text()
        if image:
            t.append("image: ", style="dim")
            t.append(Path(image).name, style="bold")
            if n_images > 1:
                t.append(f"  ({n_images} images in this chat)", style="dim")
        else:
            t.append("no image attached: /image PATH, Ctrl+F to pick one, or paste a path", style="dim")
        self.update(t)
