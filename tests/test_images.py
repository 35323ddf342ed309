"""Image input: every kind of file a user may attach becomes 8-bit RGB, or a clear ImageError."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from edge_agent.core.errors import ImageError
from edge_agent.tools import images
from edge_agent.tools.images import fit_for_model, load_image, load_image_bytes, model_png, snap_to_grid


def _bytes(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_exif_orientation_is_applied(tmp_path):
    """A landscape JPEG tagged 'rotate 90' (orientation 6) loads as portrait, pixels turned."""
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    im.paste((0, 0, 255), (0, 0, 10, 20))  # blue strip on the left
    exif = Image.Exif()
    exif[0x0112] = 6
    p = tmp_path / "rot.jpg"
    im.save(p, exif=exif, quality=95)
    out = load_image(p)
    assert out.size == (20, 40) and out.original_size == (40, 20)
    top = np.asarray(out.image)[:5].reshape(-1, 3).mean(0)
    assert top[2] > 200 and top[0] < 60  # the left blue strip is now on top


def test_rgba_palette_cmyk_and_16bit_become_rgb():
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # fully transparent red -> white
    out = load_image_bytes(_bytes(rgba, "PNG")).image
    assert out.mode == "RGB" and out.getpixel((0, 0)) == (255, 255, 255)

    pal = Image.new("P", (8, 8), 0)
    pal.putpalette([10, 20, 30] + [0] * 765)
    assert load_image_bytes(_bytes(pal, "GIF")).image.getpixel((1, 1)) == (10, 20, 30)

    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # pure red in CMYK
    r, g, b = load_image_bytes(_bytes(cmyk, "JPEG")).image.getpixel((4, 4))
    assert r > 200 and g < 60 and b < 60

    arr = np.linspace(1000, 60000, 64, dtype=np.uint16).reshape(8, 8)
    i16 = Image.fromarray(arr)  # uint16 -> mode I;16
    assert i16.mode.startswith("I;16")
    px = np.asarray(load_image_bytes(_bytes(i16, "PNG")).image)
    assert px.min() == 0 and px.max() == 255  # range stretched, not clipped to white


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    r, g, _ = load_image_bytes(buf.getvalue()).image.getpixel((2, 2))
    assert r > 200 and g < 50


def test_unreadable_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ImageError, match="not found"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(ImageError, match="folder"):
        load_image(tmp_path)
    (tmp_path / "e.png").write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image(tmp_path / "e.png")
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(ImageError, match="not an image"):
        load_image(tmp_path / "t.txt")
    good = _bytes(Image.new("RGB", (64, 64), (1, 2, 3)), "PNG")
    (tmp_path / "cut.png").write_bytes(good[: len(good) // 2])
    with pytest.raises(ImageError, match="damaged|not an image"):
        load_image(tmp_path / "cut.png")


def test_decompression_bomb_is_refused_before_decoding(monkeypatch):
    monkeypatch.setattr(images, "MAX_SOURCE_PIXELS", 100)
    with pytest.raises(ImageError, match="megapixels"):
        load_image_bytes(_bytes(Image.new("RGB", (20, 20)), "PNG"))


def test_fit_for_model_budget_tiny_and_strips():
    big = fit_for_model(Image.new("RGB", (2000, 1000)), max_pixels=100_000)
    assert big.width * big.height <= 100_000 and abs(big.width / big.height - 2) < 0.02
    tiny = fit_for_model(Image.new("RGB", (3, 3)))
    assert min(tiny.size) >= images.MODEL_MIN_SIDE
    strip = fit_for_model(Image.new("RGB", (3000, 4)), max_pixels=50_000)
    assert min(strip.size) >= images.MODEL_MIN_SIDE and strip.width * strip.height <= 50_000 * 1.02
    png = model_png(Image.new("RGB", (10, 10)))
    assert Image.open(io.BytesIO(png)).size == (64, 64)


def test_snap_to_grid_rounds_to_the_token_grid_within_the_budget():
    """Qwen's smart_resize: each side rounded to the grid (half up, as std::round), both floored when the
    rounded area is over the budget; already on the grid, or grid 1: the same image."""
    budget = 256 * 32 * 32
    assert snap_to_grid(Image.new("RGB", (500, 500)), 32, budget).size == (512, 512)  # 256 tokens: fits
    assert snap_to_grid(Image.new("RGB", (756, 346)), 32, budget).size == (736, 320)  # 768x352 is over
    assert snap_to_grid(Image.new("RGB", (48, 80)), 32, budget).size == (64, 96)  # 1.5 and 2.5 round up
    assert snap_to_grid(Image.new("RGB", (10, 10)), 32, budget).size == (32, 32)  # at least one token
    same = Image.new("RGB", (768, 352))
    assert snap_to_grid(same, 32, 576 * 32 * 32) is same and snap_to_grid(same, 1, 1) is same
    for w, h in [(756, 346), (1000, 211), (333, 777), (640, 480)]:
        gw, gh = snap_to_grid(Image.new("RGB", (w, h)), 32, budget).size
        assert gw % 32 == gh % 32 == 0 and gw * gh <= budget
