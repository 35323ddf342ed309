"""In-terminal image previews.

Default: a character-cell picture, textual-image's half-cell renderer (two pixels per cell with the
upper half block: foreground = top pixel, background = bottom pixel) at a size computed here from the
image alone; deterministic, works in every terminal, tmux and SVG snapshots. Where the terminal speaks a
graphics protocol (Kitty TGP or Sixel, detected by ``textual-image`` before the app starts),
``enable_graphics()`` switches previews to real pixels. Files are read by ``tools.images.load_image``
(the agent's own loader: EXIF rotation, the decompression-bomb limit, errors that say what to do).
Knows Pillow, Rich and textual-image; does not know the agent.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw
from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static
from textual_image.renderable.halfcell import Image as HalfcellRenderable

from edge_agent.core.errors import ImageError
from edge_agent.tools.images import SUFFIXES, load_image

IMAGE_SUFFIXES = SUFFIXES  # what the file picker and a pasted path accept: what the agent can read

log = logging.getLogger(__name__)

# The textual-image widget class when the terminal shows real pixels; None: character cells.
_GRAPHICS: Callable[[Image.Image], Widget] | None = None  # textual-image's widget for this terminal


def enable_graphics() -> str:
    """Detect a graphics protocol (call before App.run: it queries the terminal). Returns what is used.

    ``EDGE_AGENT_IMAGES=cells`` forces the character-cell previews.
    """
    global _GRAPHICS
    if not sys.__stdout__ or not sys.__stdout__.isatty():
        return "cells"
    # Importing textual_image.renderable (this module does) detects the protocol; importing its widget
    # module measures the cell size, which every textual-image renderer (the half-cell one too) asks for
    # when drawing: done now, it is cached, and nothing queries the terminal once Textual owns it.
    from textual_image import renderable

    try:
        from textual_image.widget import Image as GraphicsImage
    except (ArithmeticError, OSError, ValueError) as e:  # e.g. a terminal that reports 0 columns
        log.warning("textual-image could not measure this terminal (%s): character-cell previews", e)
        return "cells"
    if os.environ.get("EDGE_AGENT_IMAGES", "auto") == "cells":
        return "cells"
    if renderable.Image in (renderable.TGPImage, renderable.SixelImage):
        _GRAPHICS = GraphicsImage
        return "tgp" if renderable.Image is renderable.TGPImage else "sixel"
    return "cells"


def open_image(path: str | Path) -> Image.Image:
    """Open and fully decode an image file as RGB, as the agent will (a clear ImageError for anything
    else)."""
    return load_image(path).image


def looks_like_image_path(text: str) -> Path | None:
    """A pasted path to an existing image file (quotes and file:// stripped), else None."""
    s = text.strip().strip("'\"")
    if s.startswith("file://"):
        s = s[7:]
    s = s.replace("\\ ", " ")
    if not s or "\n" in s or not s.lower().endswith(IMAGE_SUFFIXES):
        return None
    p = Path(s).expanduser()
    return p if p.is_file() else None


def with_box(img: Image.Image, bbox_1000: list[float] | tuple[float, ...], color=(255, 220,
                                                                                  0)) -> Image.Image:
    """A copy of ``img`` with the box ``[x1, y1, x2, y2]`` (0-1000 relative coords, Qwen's) drawn on it."""
    out = img.copy()
    w, h = out.size
    try:
        x1, y1, x2, y2 = (float(v) for v in bbox_1000[:4])
    except (TypeError, ValueError):
        return out
    box = [x1 * w / 1000, y1 * h / 1000, x2 * w / 1000, y2 * h / 1000]
    box = [min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])]
    ImageDraw.Draw(out).rectangle(box, outline=color, width=max(1, min(w, h) // 40))
    return out


def cell_size(img: Image.Image, max_width: int, max_height: int) -> tuple[int, int]:
    """(columns, rows) that show ``img`` at its aspect ratio within the box (a cell is ~1:2, w:h)."""
    w, h = img.size
    scale = min(max_width / w, (2 * max_height) / h)
    cw, ph = max(1, round(w * scale)), max(2, round(h * scale))
    return cw, (ph + ph % 2) // 2


def half_blocks(img: Image.Image, max_width: int, max_height: int) -> HalfcellRenderable:
    """``img`` in at most ``max_width`` x ``max_height`` cells (2 px a cell, upper half block).

    The size is fixed here (not textual-image's "auto", which asks the terminal for its cell size).
    """
    cols, rows = cell_size(img, max_width, max_height)
    return HalfcellRenderable(img, width=cols, height=rows)


class ImagePreview(Static):
    """A picture of an image file (optionally with a zoom box) in ``width`` x ``height`` cells."""

    DEFAULT_CSS = """
    ImagePreview { width: auto; height: auto; }
    """

    def __init__(self, path: str | Path | None, *, width: int = 24, height: int = 8,
                 box: list[float] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.path = str(path) if path else None
        self.max_w, self.max_h, self.box = width, height, box

    def on_mount(self) -> None:
        self.show(self.path, self.box)

    def show(self, path: str | Path | None, box: list[float] | None = None) -> None:
        self.path, self.box = (str(path) if path else None), box
        if self.path is None:
            self.update(Text("no image", style="dim"))
            return
        try:
            img = open_image(self.path)
        except ImageError as e:
            self.update(Text(f"[{e.message}]", style="dim red"))
            return
        if self.box is not None:
            img = with_box(img, self.box)
        if _GRAPHICS is not None:
            cols, rows = cell_size(img, self.max_w, self.max_h)
            self.update("")
            self.remove_children()
            g = _GRAPHICS(img)
            g.styles.width, g.styles.height = cols, rows
            self.styles.width, self.styles.height = cols, rows
            self.mount(g)
            return
        self.update(half_blocks(img, self.max_w, self.max_h))
