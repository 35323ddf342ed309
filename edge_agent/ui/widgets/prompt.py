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

from edge_agent.ui.widgets.preview import looks_like_image_path

SLASH_HELP = (
    "/image PATH  attach an image (or paste a path, then the question; or Ctrl+F); several: attach each\n"
    "/image 2  the chat's 2nd image again   /detach  the last one off (Ctrl+D)   /image none  all off\n"
    "/retry  answer the last question again\n"
    "/edit  put the last question back in the prompt to change and resend\n"
    "/new  new chat   /chats  list chats   /export  export this chat\n"
    "/mode ssr|freeform|direct   /offline on|off   /settings   /help"
)
KEY_HELP = (
    "Esc stop the answer · Ctrl+F attach an image · Ctrl+D detach it · Ctrl+T reasoning · Ctrl+R mode "
    "(SSR, free-form, direct)\nCtrl+Y copy the answer · Ctrl+O chats (/ searches them) · Ctrl+N new chat · "
    "Ctrl+S settings · Ctrl+P every command · Ctrl+Q quit"
)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".heic", ".avif")
PLACEHOLDER_VISION = "Ask about your image…  (/image PATH attaches one; /help)"
PLACEHOLDER_TEXT = "Ask a question…  (this model reads text only; /help)"
# while the model loads: what it can read is not known yet (a text-only model would be told "your image")
PLACEHOLDER_LOADING = "Ask a question…  (/image PATH attaches an image; /help)"


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


def path_like(text: str) -> str | None:
    """``text`` when it reads as a file path rather than a question (``/tmp/x/notes.txt``,
    ``~/a b.png`` quoted or with ``\\ ``, ``file://...``, ``sigm.png``), with quotes and file:// removed;
    else None. Whether the file exists does not matter: a path is never sent to the model."""
    s = text.strip()
    quoted = len(s) >= 2 and s[0] == s[-1] and s[0] in "'\""
    s = s.strip("'\"")
    if s.startswith("file://"):
        s, quoted = s[7:], True
    if not s or "\n" in s:
        return None
    bare = s.replace("\\ ", "")
    one_word = quoted or not any(c.isspace() for c in bare)
    starts = s.startswith(("/", "~/", "./", "../")) or (len(s) > 2 and s[1:3] in (":\\", ":/"))
    if one_word and (starts or s.lower().endswith(IMAGE_SUFFIXES)
                     or ("/" in s and "." in s.rpartition("/")[2][1:])):
        if s.endswith("?"):
            return None
        return s.replace("\\ ", " ")
    return None


def path_and_question(text: str) -> tuple[str, str] | None:
    """``(path, words)`` when ``text`` starts with an image file's path followed by words (a path pasted or
    dropped, then the question typed: ``/tmp/photo.jpg what is written here?``), else None. The path may be
    quoted, have ``\\ `` for its spaces, be a ``file://`` URL, or hold plain spaces when the file exists; a
    first word that only looks like an image's path (``~/x.png``, ``./a b.jpg`` quoted) is returned too, so
    a file that is not there is reported instead of sent as a question."""
    s = text.strip()
    if not s or "\n" in s:
        return None
    if s[0] in "'\"":  # quoted: up to the closing quote
        end = s.find(s[0], 1)
        if end < 0:
            return None
        head, rest = s[1:end], s[end + 1:]
    else:
        cuts = [i for i, c in enumerate(s) if c.isspace() and s[i - 1] != "\\"]
        if not cuts:
            return None
        # the longest prefix that is an existing image file (plain spaces in a name), else the first word
        found = next((i for i in reversed(cuts) if looks_like_image_path(s[:i]) is not None), cuts[0])
        head, rest = s[:found], s[found:]
    head = head.removeprefix("file://").replace("\\ ", " ")
    rest = rest.strip()
    if not rest or not head.lower().endswith(IMAGE_SUFFIXES):
        return None
    if looks_like_image_path(head) is None and not head.startswith(("/", "~/", "./", "../")):
        return None  # "photo.png is it?" is a question about a name, not a pasted path
    return head, rest


class PromptInput(Input):
    """Enter submits; Up/Down walk through earlier questions (kept across chats)."""

    BINDINGS = [
        Binding("up", "history(-1)", "Previous", show=False),
        Binding("down", "history(1)", "Next", show=False),
    ]

    def __init__(self, history: list[str] | None = None, **kw) -> None:
        # select_on_focus off: coming back to the prompt (Ctrl+N, /edit, after a dialog) must not select the
        # draft, or the next key replaces it
        super().__init__(placeholder=PLACEHOLDER_LOADING, select_on_focus=False, **kw)
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
    """Which images the next question is about."""

    DEFAULT_CSS = """
    AttachmentBar { height: auto; padding: 0 1; color: $text-muted; }
    """

    text_only = False  # the loaded model reads no images: say what it can do instead

    def show(self, attached: list[str], n_images: int) -> None:
        t = Text()
        if attached:
            t.append("image: " if len(attached) == 1 else f"{len(attached)} images: ", style="dim")
            t.append(", ".join(Path(p).name for p in attached), style="bold")
            t.append("  (Ctrl+D or /detach: ask without it)" if len(attached) == 1
                     else f"  (Ctrl+D: without {Path(attached[-1]).name})", style="dim")
            if n_images > len(attached):
                t.append(f"  ({n_images} images in this chat)", style="dim")
        elif self.text_only:
            t.append("text-only model: ask questions without an image (Ctrl+S to choose a vision model)",
                     style="dim")
        else:
            t.append("no image attached: /image PATH, Ctrl+F to pick one, or paste a path", style="dim")
        self.update(t)
