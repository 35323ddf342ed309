"""The image picker: a directory tree that shows only folders and image files, plus a path box.

Dismisses with the chosen path (or None). Starts in the folder of the last image, else the
current directory. Reading folders is local disk only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Input, Static

from edge_agent.ui.widgets.preview import IMAGE_SUFFIXES, ImagePreview


class ImageTree(DirectoryTree):
    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        out = []
        for p in paths:
            if p.name.startswith("."):
                continue
            try:
                if p.is_dir() or p.suffix.lower() in IMAGE_SUFFIXES:
                    out.append(p)
            except OSError:  # unreadable entries are simply not offered
                continue
        return out


class ImagePickerScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("backspace", "up", "Parent folder")]
    DEFAULT_CSS = """
    ImagePickerScreen { align: center middle; }
    ImagePickerScreen #picker { width: 100; max-width: 100%; height: 85%; border: thick $accent;
                                background: $surface; }
    ImagePickerScreen #picker-body { height: 1fr; }
    ImagePickerScreen ImageTree { width: 1fr; }
    ImagePickerScreen #picker-preview { width: 34; padding: 0 1; }
    ImagePickerScreen #picker-hint { color: $text-muted; padding: 0 1; }
    """

    def __init__(self, start: Path | None = None) -> None:
        super().__init__()
        start = (start or Path.cwd()).expanduser()
        self.start = start if start.is_dir() else Path.cwd()

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Static("[b]Attach an image[/b]  Enter on a file attaches it · Backspace: parent folder · "
                         "Esc cancels", id="picker-hint")
            yield Input(str(self.start) + "/", placeholder="or type a path and press Enter", id="picker-path")
            with Horizontal(id="picker-body"):
                yield ImageTree(self.start)
                yield ImagePreview(None, width=32, height=14, id="picker-preview")

    def on_mount(self) -> None:
        self.query_one(ImageTree).focus()

    def action_up(self) -> None:
        if self.focused is self.query_one("#picker-path"):
            return  # backspace edits the typed path
        tree = self.query_one(ImageTree)
        tree.path = Path(tree.path).resolve().parent

    @on(DirectoryTree.FileSelected)
    def chosen(self, event: DirectoryTree.FileSelected) -> None:
        self.dismiss(Path(event.path))

    @on(DirectoryTree.NodeHighlighted)
    def highlighted(self, event: DirectoryTree.NodeHighlighted) -> None:
        data = event.node.data
        path = getattr(data, "path", None)
        if path is not None and Path(path).is_file():
            self.query_one("#picker-preview", ImagePreview).show(path)

    @on(Input.Submitted, "#picker-path")
    def typed(self, event: Input.Submitted) -> None:
        p = Path(event.value.strip()).expanduser()
        if p.is_dir():
            self.query_one(ImageTree).path = p
        elif p.is_file():
            self.dismiss(p)
        else:
            self.notify(f"No file or folder at {p}.", title="Not found", severity="warning")
