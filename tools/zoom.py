"""The zoom tool: crop a region of the original image or of an earlier crop (pillow only).

Knows: ``bbox_2d`` = [x1, y1, x2, y2] in Qwen3-VL's 0-1000 relative coordinates of the image
``img_idx`` (0 = the original, 1.. = earlier crops; a question about several images: 0.. n-1 the
originals, then the crops); how to repair a sloppy box (swapped corners,
values outside 0-1000, a box too small or too thin to be useful) or refuse one that cannot mean
anything (not four numbers, entirely outside the image; a box with no area is taken as a point
to zoom around); how to enlarge a crop to a size
the vision encoder can use, within the model's pixel budget. Crops are always cut from the
full-resolution original it shows (a crop of a crop is composed back to original pixels), so zooming twice
loses nothing. Does not know: models, tokens, the agent's chat format.

A refused box raises :class:`ZoomError`; its message is written for the model to read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from edge_agent.tools.images import MODEL_MAX_PIXELS, fit_for_model, model_png, snap_to_grid, to_png

# A crop smaller than this (in original pixels) holds less than one 32x32 vision block: grow it.
MIN_CROP_SIDE = 32
# Thinner boxes than 1:MAX_ASPECT are widened on their short side (a 1000x3 sliver says nothing).
MAX_ASPECT = 8.0
# Crops are upscaled towards this many pixels (~256 vision tokens), but never more than MAX_UPSCALE x.
CROP_TARGET_PIXELS = 512 * 512
MAX_UPSCALE = 4.0
# A box with no area (a point, a line) becomes a box this wide (0-1000 units) around it.
POINT_BOX = 250.0


class ZoomError(ValueError):
    """A box the tool refuses; ``str(e)`` is the observation the model sees."""


Box = tuple[int, int, int, int]


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def normalize_bbox(raw: object) -> tuple[Box, list[str]]:
    """Validate and repair a 0-1000 box. Returns (x1, y1, x2, y2) ints with x1<x2, y1<y2, and notes."""
    if not isinstance(raw, list | tuple) or len(raw) != 4 or not all(_is_number(v) for v in raw):
        raise ZoomError(f"bbox_2d must be four numbers [x1, y1, x2, y2] from 0 to 1000, got {raw!r}.")
    x1, y1, x2, y2 = (float(v) for v in raw)
    notes: list[str] = []
    if x1 > x2 or y1 > y2:
        x1, x2 = min(x1, x2), max(x1, x2)
        y1, y2 = min(y1, y2), max(y1, y2)
        notes.append("corners were swapped")
    if x2 < 0 or y2 < 0 or x1 > 1000 or y1 > 1000:
        raise ZoomError(f"bbox_2d {list(raw)} lies outside the image; coordinates go from 0 to 1000.")
    clamped = [min(max(v, 0.0), 1000.0) for v in (x1, y1, x2, y2)]
    if clamped != [x1, y1, x2, y2]:
        notes.append("box was clipped to the image (0-1000)")
    x1, y1, x2, y2 = clamped
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        # A point or a line: zoom around it (a box of POINT_BOX units centred there), as a person
        # pointing at a spot would mean. Both corners equal AND at the image's edge still works.
        if x2 - x1 <= 0:
            x1, x2 = _grow(x1, x2, POINT_BOX, 1000.0)
        if y2 - y1 <= 0:
            y1, y2 = _grow(y1, y2, POINT_BOX, 1000.0)
        notes.append(f"the box had no area, so the crop is {POINT_BOX:.0f}/1000 around that point")
    box = (math.floor(x1), math.floor(y1), math.ceil(x2), math.ceil(y2))
    return box, notes


def _grow(lo: float, hi: float, want: float, limit: float) -> tuple[float, float]:
    """Widen [lo, hi] around its centre to length ``want`` (<= limit), shifted to stay in [0, limit]."""
    want = min(want, limit)
    if hi - lo >= want:
        return lo, hi
    c = (lo + hi) / 2
    lo, hi = c - want / 2, c + want / 2
    if lo < 0:
        lo, hi = 0.0, want
    if hi > limit:
        lo, hi = limit - want, limit
    return lo, hi


def box_to_pixels(box: Box, width: int, height: int) -> tuple[tuple[float, float, float, float], list[str]]:
    """0-1000 box -> pixel box (floats) on a width x height image, grown if tiny or too thin."""
    x1, y1, x2, y2 = (box[0] * width / 1000, box[1] * height / 1000, box[2] * width / 1000,
                      box[3] * height / 1000)
    notes: list[str] = []
    w, h = x2 - x1, y2 - y1
    if w < MIN_CROP_SIDE or h < MIN_CROP_SIDE:
        x1, x2 = _grow(x1, x2, MIN_CROP_SIDE, width)
        y1, y2 = _grow(y1, y2, MIN_CROP_SIDE, height)
        notes.append(f"box was enlarged to at least {MIN_CROP_SIDE} px")
    w, h = x2 - x1, y2 - y1
    if w / h > MAX_ASPECT:
        y1, y2 = _grow(y1, y2, w / MAX_ASPECT, height)
        notes.append("box was made less thin")
    elif h / w > MAX_ASPECT:
        x1, x2 = _grow(x1, x2, h / MAX_ASPECT, width)
        notes.append("box was made less thin")
    return (x1, y1, x2, y2), notes


def enlarge_crop(crop: Image.Image, *, max_pixels: int = MODEL_MAX_PIXELS) -> Image.Image:
    """Upscale a small crop towards CROP_TARGET_PIXELS (at most MAX_UPSCALE x), within max_pixels."""
    w, h = crop.size
    target = min(CROP_TARGET_PIXELS, max_pixels)
    if w * h < target:
        scale = min((target / (w * h)) ** 0.5, MAX_UPSCALE)
        crop = crop.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)
    return fit_for_model(crop, max_pixels=max_pixels)


@dataclass
class StoredImage:
    """An original (index 0, or 0..n-1 for several) or a crop. ``box`` is the region in the pixels of
    the original ``root`` it was cut from."""

    index: int
    image: Image.Image  # full-resolution pixels (a crop is cut from the original, not upscaled)
    box: tuple[float, float, float, float]
    parent: int | None = None
    label: str = ""
    path: Path | None = None  # where the crop was saved, if a crops folder was given
    _model_png: bytes | None = field(default=None, repr=False)
    root: int = 0  # the original it shows (itself for an original)

    def model_png(self, max_pixels: int = MODEL_MAX_PIXELS, grid: int = 1) -> bytes:
        """PNG bytes for the model (cached): originals fitted to the budget, crops also enlarged and snapped
        to the model's ``grid`` of pixels a token (``snap_to_grid``: within their budget of tokens)."""
        if self._model_png is None:
            if self.parent is None:
                self._model_png = model_png(self.image, max_pixels=max_pixels)
            else:
                img = enlarge_crop(self.image, max_pixels=max_pixels)  # fitted to the budget
                self._model_png = to_png(snap_to_grid(img, grid, max_pixels))
        return self._model_png


@dataclass
class ZoomResult:
    image: StoredImage
    observation: str  # what the model reads next to the crop
    notes: list[str]
    bbox_2d: Box  # the box actually used, 0-1000 on the image it was asked of


class ImageStore:
    """The images of one conversation: index 0 is the original (``more``: further originals, 1..n-1),
    each zoom appends a crop."""

    def __init__(self, original: Image.Image, *, crops_dir: Path | None = None,
                 max_pixels: int = MODEL_MAX_PIXELS, crop_max_pixels: int | None = None,
                 original_png: bytes | None = None,
                 more: Sequence[tuple[Image.Image, bytes | None]] = (), grid: int = 1) -> None:
        self.max_pixels = max_pixels  # each original's budget (image_max_tokens x 32 x 32 for Qwen3-VL)
        self.crop_max_pixels = max_pixels if crop_max_pixels is None else crop_max_pixels  # each crop's
        self.grid = grid  # pixels an image token covers a side (32 for Qwen3-VL): crops are snapped to it
        self.crops_dir = crops_dir
        # original_png: an original's model PNG already made for this budget (a follow-up question)
        self.images: list[StoredImage] = []
        for i, (img, png) in enumerate([(original, original_png), *more]):
            w, h = img.size
            self.images.append(StoredImage(i, img, (0.0, 0.0, float(w), float(h)), _model_png=png, root=i))
        self.n_originals = len(self.images)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int) -> StoredImage:
        return self.images[idx]

    def model_png(self, idx: int) -> bytes:
        """The model's PNG of image ``idx`` within its budget (the original's, or a crop's)."""
        if idx < self.n_originals:
            return self.images[idx].model_png(self.max_pixels)
        return self.images[idx].model_png(self.crop_max_pixels, self.grid)

    def check_index(self, img_idx: object) -> int:
        if not isinstance(img_idx, int) or isinstance(img_idx, bool) or not 0 <= img_idx < len(self.images):
            have = "0" if len(self.images) == 1 else f"0-{len(self.images) - 1}"
            n = self.n_originals
            what = "0 is the original" if n == 1 else f"0-{n - 1} are the originals"
            raise ZoomError(f"img_idx {img_idx!r} does not exist; available images: {have} ({what}).")
        return img_idx

    def zoom(self, bbox_2d: object, img_idx: object = 0, label: str = "") -> ZoomResult:
        """Crop ``bbox_2d`` (0-1000 on image ``img_idx``). Raises ZoomError for a box it refuses."""
        idx = self.check_index(img_idx)
        box, notes = normalize_bbox(bbox_2d)
        parent = self.images[idx]
        px0, py0, px1, py1 = parent.box  # the parent's region in original pixels
        pw, ph = px1 - px0, py1 - py0
        (x1, y1, x2, y2), more = box_to_pixels(box, max(1, round(pw)), max(1, round(ph)))
        notes += more
        # compose into original pixel coordinates and cut from the full-resolution original
        ox1, oy1, ox2, oy2 = px0 + x1, py0 + y1, px0 + x2, py0 + y2
        orig = self.images[parent.root].image
        crop = orig.crop((math.floor(ox1), math.floor(oy1), math.ceil(ox2), math.ceil(oy2)))
        label = " ".join(str(label).split())[:80]
        new = StoredImage(len(self.images), crop, (ox1, oy1, ox2, oy2), parent=idx, label=label,
                          root=parent.root)
        self.images.append(new)
        if self.crops_dir is not None:
            self.crops_dir.mkdir(parents=True, exist_ok=True)
            new.path = self.crops_dir / f"crop-{new.index}.png"
            new.path.write_bytes(to_png(crop))
        self.model_png(new.index)  # encode now, so the cost is counted as tool time
        # Beside the crop the model reads only what it could not know: how its box was repaired. Qwen-Agent's
        # zoom tool for Qwen3-VL answers with the crop alone; the box and label are in the call just
        # before it, and the crop's index is its place among the images (the schema says so). Each text
        # token here is evaluated at the crop's depth on the question's path (~18 ms a token at 2B).
        obs = "Note: " + "; ".join(notes) + "." if notes else ""
        return ZoomResult(image=new, observation=obs, notes=notes, bbox_2d=box)
