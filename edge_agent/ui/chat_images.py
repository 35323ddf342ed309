"""The chat screen's images: the panel that shows them, and attaching, detaching and picking them.

A mixin of :class:`edge_agent.ui.chat_screen.ChatScreen` (it uses the screen's ``host``, ``image``,
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

from edge_agent.errors import EdgeAgentError
from edge_agent.ui.preview import ImagePreview, open_image
from edge_agent.ui.prompt import AttachmentBar

if TYPE_CHECKING:
    from edge_agent.ui.host import EngineHost

TEXT_ONLY_IMAGE = ("The loaded model is text only (no mmproj): it cannot look at images. Choose a vision model in "
                   "the settings (Ctrl+S) or `edge-agent models pull qwen3-vl-2b-instruct`, or ask without an image.")


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

    def show(self, current: str | None, images: list[str]) -> None:
        self.query_one("#current-image", ImagePreview).show(current)
        t = Text()
        for i, p in enumerate(images, 1):
            t.append(("▶ " if p == current else "  ") + f"{i}. {Path(p).name}\n",
                     style="bold" if p == current else "dim")
        self.query_one("#image-list", Static).update(t)



class ImageActions(Screen):
    """Attach / detach / pick: the chat screen's images (its base class)."""

    host: EngineHost
    image: str | None
    images: list[str]

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
        self.image = p
        if p not in self.images:
            self.images.append(p)
        self._show_images()
        self.notify(f"{Path(p).name} attached. Ask your question.", title="Image attached", timeout=3)
        self.read_ahead()  # the photo is read into the chat's context while the question is typed
        return True

    def _show_images(self) -> None:
        self.query_one(ImagePanel).show(self.image, self.images)
        self.query_one(AttachmentBar).show(self.image, len(self.images))

    def action_detach_image(self) -> None:
        """The next questions go without an image (the chat keeps its earlier ones: /image N)."""
        if self.image is None:
            self.notify("No image is attached.", title="Nothing to detach", timeout=3)
            return
        name = Path(self.image).name
        self.image = None
        self._show_images()
        self.read_ahead()  # the photo leaves what was read ahead; the chat's context stays
        self.notify(f"{name} detached: the next question goes without an image. /image 1 attaches it again.",
                    title="Image detached", timeout=4)

    def action_pick_image(self) -> None:
        from edge_agent.ui.picker import ImagePickerScreen

        start = Path(self.image).parent if self.image else None

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.attach(path)

        self.app.push_screen(ImagePickerScreen(start), chosen)

