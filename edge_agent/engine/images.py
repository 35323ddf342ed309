"""The engine's images: a question's image files read, normalised and fitted once, and kept a while.

Knows: what a question's ``image`` argument may be (one file, PNG/JPEG bytes, several of them, or none:
:func:`as_list`), the few images asked about lately (a follow-up does not decode, resize and re-encode
its photo; a file deleted since it was read is used as it was read), the pixel budget an attached image
is fitted to (``image_max_tokens``), and the errors a person can fix (a missing file among several says
which one, and how to ask without it). Does not know sessions, prompts or the agent.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_agent.core.errors import EdgeAgentError, ImageError
from edge_agent.engine.face import Images, ImageSource
from edge_agent.runtime.types import ModelLike
from edge_agent.tools.images import LoadedImage, load_image, load_image_bytes
from edge_agent.tools.zoom import ImageStore


def as_list(image: Images) -> list[ImageSource]:
    """A question's images as a list, in order, each once ("" from a form field: no image)."""
    if image is None:
        return []
    items: list[ImageSource] = [image] if isinstance(image, str | Path | bytes | bytearray) else list(image)
    out: list[ImageSource] = []
    for x in items:
        if isinstance(x, str) and not x.strip():
            continue
        if not any(x == y for y in out):
            out.append(bytes(x) if isinstance(x, bytearray) else x)
    return out


def label(images: Sequence[ImageSource]) -> str | None:
    """What a run's ``RunStarted.image`` names: the file (several: their paths, comma-separated)."""
    if not images:
        return None
    return ", ".join(str(x) if isinstance(x, str | Path) else "<image bytes>" for x in images)


class ImageCache:
    """The images of one engine's model (``model``: its vision and patch size; ``budget_tokens``: the
    ``image_max_tokens`` setting, read on every use). Thread-safe: ``ask``, the read-ahead and
    ``prepare_image`` use it from their threads."""

    def __init__(self, model: ModelLike, model_name: str, budget_tokens: Any) -> None:
        self.model, self.model_name, self._budget_tokens = model, model_name, budget_tokens
        self.lock = threading.Lock()
        self._recent: OrderedDict[tuple[Any, ...], tuple[LoadedImage, bytes | None]] = OrderedDict()
        self._read_as: dict[str, tuple[Any, ...]] = {}  # path -> the key of the file last read there

    def budget(self) -> int:
        """Pixels an attached image is fitted to (``image_max_tokens`` image tokens)."""
        px = self.model.image_px_per_token or 32  # Qwen3-VL: 16 px patches, 2x2 merged
        return int(self._budget_tokens()) * px * px

    def load_all(self, images: Sequence[ImageSource]) -> list[LoadedImage]:
        """Each image read (or taken from the recent ones); one that cannot be read raises, naming which
        of several it is and how to ask without it."""
        out: list[LoadedImage] = []
        for i, image in enumerate(images, 1):
            try:
                loaded = self.load(image)
            except ImageError as e:
                if len(images) == 1 or "cannot look at images" in e.message:
                    raise
                raise ImageError(f"Image {i} of {len(images)}: {e.message} Nothing was asked: fix it, or ask "
                                 "without it.", title=e.title) from e
            assert loaded is not None
            out.append(loaded)
        return out

    def load(self, image: ImageSource | None) -> LoadedImage | None:
        if image is None:
            return None
        with self.lock:
            # Read the image first: a wrong path is the first thing to fix, whatever the model.
            key = self._file_key(image, 0)
            if key is None and isinstance(image, str | Path):  # gone since it was read (on attach): as it was
                key = self._read_as.get(str(image))
            if key is not None and key in self._recent:
                loaded = self._recent[key][0]
            else:
                if isinstance(image, bytes | bytearray):
                    loaded = load_image_bytes(bytes(image))
                else:
                    loaded = load_image(image)
                if key is not None:
                    self._remember(key, loaded, None)
            if key is not None and isinstance(image, str | Path):
                self._read_as[str(image)] = key
        if not self.model.has_vision:
            raise ImageError(
                f"The model {self.model_name} has no vision projector (mmproj), so it cannot look at images. "
                "Pass --mmproj FILE, choose a vision model (edge-agent models list), or ask without an "
                "image.",
                title="Model cannot see images",
            )
        return loaded

    def fitted(self, image: ImageSource | None, loaded: LoadedImage) -> bytes:
        """The photo as the model reads it (fitted to the budget, PNG): made once per file and budget
        and kept with the recent images, so ``ask`` and ``prepare_image`` hand the vision projector
        the same bytes (the embedding cache is keyed by them)."""
        budget = self.budget()
        key = self._file_key(image, budget)
        read = self._read_as.get(str(image)) if key is None and isinstance(image, str | Path) else None
        if read is not None:  # the file is gone: the copy fitted when it was read
            key = (*read[:-1], budget)
        with self.lock:
            png = self._recent[key][1] if key is not None and key in self._recent else None
        if png is None:
            png = ImageStore(loaded.image, max_pixels=budget).model_png(0)
            if key is not None:
                with self.lock:
                    self._remember(key, loaded, png)
        return png

    def pngs(self, images: Sequence[ImageSource]) -> list[bytes]:
        """Each image as the model reads it (raises as :meth:`load_all`)."""
        return [self.fitted(x, loaded) for x, loaded in zip(images, self.load_all(images), strict=True)]

    def prepare(self, image: ImageSource) -> bool:
        """Encode an attached image into the vision projector's embedding cache (``Engine.prepare_image``)."""
        if not self.model.has_vision:
            return False
        try:
            loaded = self.load(image)
            assert loaded is not None
            return self.model.encode_image(self.fitted(image, loaded))
        except EdgeAgentError:
            return False

    @staticmethod
    def _file_key(image: ImageSource | None, budget: int) -> tuple[Any, ...] | None:
        """Identity of an image file (path, size, modification time) and a pixel budget; None for bytes
        or a file that cannot be read (then it is loaded, and its error reported, as usual)."""
        if not isinstance(image, str | Path):
            return None
        try:  # the file itself (device, inode), not its path: no realpath walk on every question
            st = os.stat(os.path.expanduser(image))
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, budget)

    def _remember(self, key: tuple[Any, ...], loaded: LoadedImage, png: bytes | None) -> None:
        self._recent[key] = (loaded, png)
        self._recent.move_to_end(key)
        while len(self._recent) > 16:  # 8 images, each as loaded and as fitted to its budget
            self._recent.popitem(last=False)
