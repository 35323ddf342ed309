"""Zoom: box repair/refusal in 0-1000 coordinates, crops of crops, enlargement, saved crops."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from edge_agent.tools.zoom import (
    CROP_TARGET_PIXELS,
    MAX_UPSCALE,
    MIN_CROP_SIDE,
    ImageStore,
    ZoomError,
    box_to_pixels,
    enlarge_crop,
    normalize_bbox,
)


def quadrants(w: int = 400, h: int = 200) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 2] = (0, 0, 255)
    a[h // 2 :, w // 2 :] = (255, 255, 255)
    return Image.fromarray(a)


def mean_rgb(im: Image.Image) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(im).reshape(-1, 3).mean(0).round())


def test_normalize_bbox_repairs_and_refuses():
    assert normalize_bbox([100, 200, 300, 400]) == ((100, 200, 300, 400), [])
    box, notes = normalize_bbox([300, 400, 100, 200])
    assert box == (100, 200, 300, 400) and "swapped" in notes[0]
    box, notes = normalize_bbox([-50, 10.4, 1200, 990.2])
    assert box == (0, 10, 1000, 991) and any("clipped" in n for n in notes)
    for bad in ([1, 2, 3], "0,0,5,5", [0, 0, "a", 5], [0, 0, float("nan"), 5], [True, 0, 5, 5], None):
        with pytest.raises(ZoomError, match="four numbers"):
            normalize_bbox(bad)
    box, notes = normalize_bbox([500, 500, 500, 700])  # a line: widened around it
    assert box == (375, 500, 625, 700) and "no area" in notes[0]
    assert normalize_bbox([0, 0, 0, 0])[0] == (0, 0, 250, 250)  # a point in the corner stays inside
    with pytest.raises(ZoomError, match="outside"):
        normalize_bbox([1100, 0, 1200, 100])


def test_tiny_and_thin_boxes_are_grown_inside_the_image():
    (x1, y1, x2, y2), notes = box_to_pixels((0, 0, 5, 5), 400, 200)  # 2x1 px at the corner
    assert (x1, y1) == (0, 0) and x2 - x1 >= MIN_CROP_SIDE and y2 - y1 >= MIN_CROP_SIDE and notes
    (x1, y1, x2, y2), notes = box_to_pixels((0, 500, 1000, 520), 1000, 1000)  # 1000 x 20 sliver
    assert (x2 - x1) / (y2 - y1) <= 8.0 + 1e-9 and y1 >= 0 and y2 <= 1000 and notes


def test_crop_content_and_crop_of_crop_composes_to_original_pixels(tmp_path):
    store = ImageStore(quadrants(), crops_dir=tmp_path / "crops")
    r = store.zoom([500, 0, 1000, 500], 0, "green part")
    assert r.image.index == 1 and r.image.image.size == (200, 100)
    assert mean_rgb(r.image.image) == (0, 255, 0)
    assert r.image.path is not None and r.image.path.exists()
    # the model reads the crop alone, as from Qwen-Agent's zoom tool: a clean box says nothing more
    assert r.observation == "" and r.image.label == "green part" and not r.notes
    # the right half of the green crop is still green, cut from the original's pixels
    r2 = store.zoom([500, 0, 1000, 1000], 1, "")
    assert r2.image.box == (300.0, 0.0, 400.0, 100.0) and mean_rgb(r2.image.image) == (0, 255, 0)
    assert len(store) == 3
    with pytest.raises(ZoomError, match="img_idx 5 does not exist; available images: 0-2"):
        store.zoom([0, 0, 10, 10], 5)


def test_a_repaired_box_is_the_only_text_beside_the_crop():
    store = ImageStore(quadrants())
    r = store.zoom([1000, 500, 500, 0], 0, "green part")  # corners swapped
    assert r.bbox_2d == (500, 0, 1000, 500) and mean_rgb(r.image.image) == (0, 255, 0)
    assert r.observation == "Note: corners were swapped."
    r = store.zoom([500, 500, 500, 500], 0)  # a point
    assert r.observation.startswith("Note: the box had no area, so the crop is 250/1000 around that point")


def test_model_png_of_a_crop_is_enlarged_within_limits():
    small = Image.new("RGB", (40, 30))
    big = enlarge_crop(small)
    assert big.width <= 40 * MAX_UPSCALE + 1 and big.width > 40
    mid = enlarge_crop(Image.new("RGB", (300, 300)))
    assert mid.width * mid.height <= CROP_TARGET_PIXELS * 1.01 and mid.width > 300
    store = ImageStore(quadrants())
    r = store.zoom([0, 0, 100, 100], 0)
    png = Image.open(io.BytesIO(r.image.model_png()))
    assert png.width > r.image.image.width  # enlarged for the vision encoder
