"""The chat screen's images: the panel that shows them, and attaching, detaching and picking them.

A mixin of :class:`edge_agent.ui.screens.chat.ChatScreen` (it uses the screen's ``host``, ``image``,
``images``, ``read_ahead`` and widgets). Attaching decodes the file once (a broken one is refused here,
not inside the model) and reads it ahead into the chat's context while the question is typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from edge_agent.core.errors import EdgeAgentError
from edge_agent.ui.widgets.preview import ImagePreview, looks_like_image_path, open_image
from edge_agent.ui.widgets.prompt import AttachmentBar, path_and_question

if TYPE_CHECKING:
    from edge_agent.ui.host import EngineHost

TEXT_ONLY_IMAGE = ("The loaded model is text only (no mmproj): it cannot look at images. Choose a vision "
                   "model in the settings (Ctrl+S) or `edge-agent models pull qwen3-vl-2b-instruct`, or ask "
                   "without an image.")


class ImagePanel(Vertical):
    DEFAULT_CSS = """
    ImagePanel { width: 36; padding: 0 1; border-left: vkey $panel; }
    ImagePanel #current-image { height: auto; }
    ImagePanel .panel-title { color: $text-muted; text-style: bold; height: 1; }
    ImagePanel #image-list { color: $text-muted; height: auto; margin: 1 0 0 0; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Image", classes="panel-title")
        yield ImagePreview(None, width=32, height=16, id="current-image")
        yield Static(id="image-list")

    def show(self, attached: list[str], images: list[str]) -> None:
        """The image attached last in the preview; the chat's images listed by number, the attached marked."""
        self.query_one("#current-image", ImagePreview).show(attached[-1] if attached else None)
        t = Text()
        for i, p in enumerate(images, 1):
            t.append(("▶ " if p in attached else "  ") + f"{i}. {Path(p).name}\n",
                     style="bold" if p in attached else "dim")
        self.query_one("#image-list", Static).update(t)


def names(paths: list[str]) -> str:
    return ", ".join(Path(p).name for p in paths)


def one_or_all(paths: list[str]) -> str | tuple[str, ...] | None:
    """What the engine takes as a question's images: the file, a tuple of several, or None."""
    return (paths[0] if len(paths) == 1 else tuple(paths)) or None


class ImageActions(Screen):
    """Attach / detach / pick: the chat screen's images (its base class).

    ``attached``: the images the next question goes with, in order; ``images``: every image of the chat
    (``/image N`` is the Nth). Images attached one after another all go with the next question; once a
    question went with them they stay attached for the follow-ups, and the next image attached starts
    a new set (``/image N`` adds an earlier one back to it)."""

    host: EngineHost
    attached: list[str]
    images: list[str]
    sent: bool  # a question went with the attached images: the next attach starts a new set

    @property
    def image(self) -> str | None:
        """The image attached last (None: none attached)."""
        return self.attached[-1] if self.attached else None

    def read_ahead(self) -> None:
        """What is given so far is read ahead (the chat screen's)."""

    def attach(self, path: str | Path) -> bool:
        """Attach an image for the next questions; False (and says why) when it cannot be: not an image,
        or a loaded model that reads text only."""
        if not self.host.sees_images:
            self.notify(TEXT_ONLY_IMAGE, title="Model cannot see images", severity="error", timeout=8)
            return False
        try:
            open_image(path)  # decodes once: a broken file fails here, not inside the model
        except EdgeAgentError as e:
            self.notify(e.message, title=e.title, severity="error", timeout=8)
            return False
        p = str(Path(path).expanduser().resolve())
        if self.sent:
            self.attached, self.sent = [], False
        if p in self.attached:
            self.attached.remove(p)
        self.attached.append(p)
        if p not in self.images:
            self.images.append(p)
        self._show_images()
        n = len(self.attached)
        what = "Ask your question." if n == 1 else f"The next question goes with {n} images: " \
            f"{names(self.attached)}."
        self.notify(f"{Path(p).name} attached (image {self.number(p)}). {what}", title="Image attached",
                    timeout=3)
        self.read_ahead()  # the photo is read into the chat's context while the question is typed
        return True

    def given(self, text: str) -> tuple[str, list[str]]:
        """What the prompt ``text`` gives the next question: its words and its images. A readable image's
        path pasted before the words counts as attached (Enter attaches it), the words as the question."""
        pasted = path_and_question(text)
        found = looks_like_image_path(pasted[0]) if pasted is not None else None
        if pasted is None or found is None or not self.host.sees_images:
            return text, self.attached
        p = str(found.resolve())
        kept = [] if self.sent else [x for x in self.attached if x != p]
        return pasted[1] + (" " if text[-1:].isspace() else ""), [*kept, p]

    def number(self, path: str) -> int:
        """The image's number in this chat (what ``/image N`` takes)."""
        return self.images.index(path) + 1

    def _show_images(self) -> None:
        self.query_one(ImagePanel).show(self.attached, self.images)
        self.query_one(AttachmentBar).show(self.attached, len(self.images))

    def action_detach_image(self) -> None:
        """The image attached last leaves the next questions (the chat keeps its earlier ones: /image N)."""
        if not self.attached:
            self.notify("No image is attached.", title="Nothing to detach", timeout=3)
            return
        p = self.attached.pop()
        self._show_images()
        self.read_ahead()  # the photo leaves what was read ahead; the chat's context stays
        rest = f"goes with {names(self.attached)}" if self.attached else "goes without an image"
        again = f"/image {self.number(p)} attaches it again."
        self.notify(f"{Path(p).name} detached: the next question {rest}. {again}", title="Image detached",
                    timeout=4)

    def detach_all(self) -> None:
        """``/image none``: the next questions go without any image."""
        if len(self.attached) < 2:
            self.action_detach_image()
            return
        gone, self.attached = self.attached, []
        self._show_images()
        self.read_ahead()
        self.notify(f"{names(gone)} detached: the next question goes without an image. /image N attaches one "
                    "again.", title="Images detached", timeout=4)

    def action_pick_image(self) -> None:
        from edge_agent.ui.screens.picker import ImagePickerScreen

        start = Path(self.image).parent if self.image else None

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.attach(path)

        self.app.push_screen(ImagePickerScreen(start), chosen)
