"""Loading and normalising images for the agent (pillow, and pillow-heif for phone photos).

Knows: how to turn whatever file a user attaches (JPEG with an EXIF rotation, PNG with alpha, a
palette GIF, a CMYK JPEG, a 16-bit TIFF/PNG, an animated GIF/WebP, a huge scan, a 3x3 icon) into a
plain 8-bit RGB picture, and how to encode one for the model (PNG bytes within a pixel budget).
Does not know: models, tokens, the agent. Nothing here touches the network.

Every failure a user can cause becomes an :class:`ImageError` that says what to do.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from edge_agent.core.errors import ImageError

# Decompression-bomb limit: refuse images with more pixels than this before decoding them. A 108 MP
# phone photo is below both; PIL itself calls 179 MP a bomb (and refuses it when opening). A JPEG is
# decoded at 1/2..1/8 scale (libjpeg's DCT scaling: memory ~ the reduced size); other formats are
# decoded whole (120 MP RGB ~ 360 MB, briefly) and then downscaled.
MAX_SOURCE_PIXELS = 120_000_000
MAX_JPEG_PIXELS = 178_000_000
# Every image is downscaled on load to at most this (memory stays bounded: 24 MP RGB = 72 MB), which
# is still ~40x what the model sees of the whole image, so zooming keeps its detail.
LOAD_MAX_PIXELS = 24_000_000
# Images sent to the model: Qwen3-VL makes one token per 32x32 block, so 1024x1024 ~ 1024 tokens;
# we keep the original at most ~0.6 MP (~600 tokens) so several crops still fit in an 8k context.
MODEL_MAX_PIXELS = 768 * 768
# Below this side length the vision encoder has less than two 32 px blocks to look at: upscale.
MODEL_MIN_SIDE = 64

def _heif_available() -> bool:
    return importlib.util.find_spec("pillow_heif") is not None


def _avif_available() -> bool:
    from PIL import features

    try:
        return bool(features.check_module("avif"))
    except ValueError:  # a Pillow without the AVIF plugin (before 11.2)
        return False


# What the picker offers and a pasted path may be: only formats this installation opens. HEIC/HEIF
# (iPhone photos) through pillow-heif's plugin, AVIF where Pillow was built with it.
SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff") + (
    (".heic", ".heif") if _heif_available() else ()) + ((".avif",) if _avif_available() else ())


@functools.cache
def _register_heif() -> None:
    """Teach Pillow HEIC/HEIF (once, on the first image: the import takes ~70 ms)."""
    if _heif_available():
        import pillow_heif

        pillow_heif.register_heif_opener()


@dataclass
class LoadedImage:
    """A normalised RGB image and where it came from."""

    image: Image.Image  # mode "RGB", 8 bits per channel, EXIF orientation applied
    source: str  # path or "<bytes>"
    format: str  # PIL's name of the file format ("JPEG", "PNG", ...)
    original_size: tuple[int, int]  # (width, height) as stored, before orientation

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def load_image(path: str | Path) -> LoadedImage:
    """Read and normalise an image file. Raises ImageError (missing, unreadable, too big...)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ImageError(f"Image file not found: {p}. Check the path (attach a JPEG, PNG, GIF or WebP file).")
    if p.is_dir():
        raise ImageError(f"{p} is a folder, not an image. Attach an image file.")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ImageError(f"Cannot read {p}: {e.strerror or e}. Check the file's permissions.") from e
    return load_image_bytes(data, source=str(p))


def load_image_bytes(data: bytes, *, source: str = "<bytes>") -> LoadedImage:
    """Decode and normalise image bytes (same rules as :func:`load_image`)."""
    if not data:
        raise ImageError(f"{source} is empty (0 bytes). Attach a real image file.")
    _register_heif()
    try:
        with warnings.catch_warnings():
            # We apply our own pixel limit below; PIL's warning would only be noise.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            fmt = im.format or "unknown"
            w, h = im.size
            if w <= 0 or h <= 0:
                raise ImageError(f"{source} has no pixels ({w}x{h}). Attach another image.")
            limit = MAX_JPEG_PIXELS if fmt == "JPEG" else MAX_SOURCE_PIXELS
            if w * h > limit:
                raise ImageError(
                    f"{source} is {w}x{h} = {w * h / 1e6:.0f} megapixels, more than the "
                    f"{limit / 1e6:.0f} MP limit for {fmt} files (a decompression bomb, or a huge scan). "
                    "Downscale it first (e.g. `convert in.jpg -resize 50% out.jpg`)."
                )
            if getattr(im, "n_frames", 1) > 1:
                im.seek(0)  # animated GIF/WebP/APNG: the first frame stands for the image
            if fmt == "JPEG" and w * h > LOAD_MAX_PIXELS:
                # libjpeg decodes at 1/2, 1/4 or 1/8 scale: take the largest that fits the budget, so the
                # full-size picture is never in memory and no resize (a second full copy) follows
                k = next((k for k in (1, 2, 3) if (w >> k) * (h >> k) <= LOAD_MAX_PIXELS), 3)
                im.draft(im.mode, (-(-w >> k), -(-h >> k)))
            im.load()
            rgb = normalise(im)
            if rgb.width * rgb.height > LOAD_MAX_PIXELS:
                f = (LOAD_MAX_PIXELS / (rgb.width * rgb.height)) ** 0.5
                rgb = rgb.resize((max(1, int(rgb.width * f)), max(1, int(rgb.height * f))),
                                 Image.Resampling.LANCZOS)
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise ImageError(
            f"{source} is not an image pillow can read ({type(e).__name__}). Attach a JPEG, PNG, HEIC, GIF "
            f"or WebP "
            "file."
        ) from e
    except (OSError, ValueError, SyntaxError, EOFError) as e:  # truncated or corrupt data
        raise ImageError(f"{source} looks damaged and cannot be decoded ({e}). Re-export or re-download "
                         "it.") from e
    return LoadedImage(image=rgb, source=source, format=fmt, original_size=(w, h))


def normalise(im: Image.Image) -> Image.Image:
    """Any PIL image -> 8-bit RGB with EXIF orientation applied; transparency composited on white."""
    if im.getexif().get(0x0112, 1) != 1:  # EXIF orientation; exif_transpose copies even when it is upright
        im = ImageOps.exif_transpose(im) or im
    mode = im.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        # 16-bit or 32-bit single channel: stretch the used range to 0-255 (a raw `convert("L")`
        # clips everything above 255 to white).
        im = im.convert("F") if mode != "F" else im
        lo, hi = im.getextrema()
        scale = 255.0 / (hi - lo) if hi > lo else 0.0
        im = im.point(lambda v: (v - lo) * scale).convert("L")
        mode = "L"
    if mode == "P":
        im = im.convert("RGBA") if "transparency" in im.info else im.convert("RGB")
        mode = im.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    if mode == "CMYK":
        return im.convert("RGB")
    if mode != "RGB":
        return im.convert("RGB")
    return im


def fit_for_model(im: Image.Image, *, max_pixels: int = MODEL_MAX_PIXELS,
                  min_side: int = MODEL_MIN_SIDE) -> Image.Image:
    """Scale so that width*height <= max_pixels and min(width, height) >= min_side (aspect kept).

    A tiny image is upscaled; an extreme strip (e.g. 3000x4) whose short side cannot reach
    ``min_side`` within the budget is padded with white on that side instead of distorted.
    """
    w, h = im.size
    scale = 1.0
    if w * h > max_pixels:
        scale = (max_pixels / (w * h)) ** 0.5
    if min(w, h) * scale < min_side:
        scale = min_side / min(w, h)
        if w * h * scale * scale > max_pixels:  # a strip: fit the long side, pad the short one
            scale = max_pixels / (max(w, h) * min_side)
    if abs(scale - 1.0) > 1e-6:
        size = (max(1, int(w * scale + 1e-9)), max(1, int(h * scale + 1e-9)))  # floor: stay within budget
        resample = Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC
        im = im.resize(size, resample)
    w, h = im.size
    if min(w, h) < min_side:
        canvas = Image.new("RGB", (max(w, min_side), max(h, min_side)), (255, 255, 255))
        canvas.paste(im, ((canvas.width - w) // 2, (canvas.height - h) // 2))
        im = canvas
    return im


def smart_resize(width: int, height: int, align: int, *, max_pixels: int,
                 min_pixels: int = 0) -> tuple[int, int]:
    """The size clip's Qwen rule ("smart resize", llama.cpp 0.3.36) gives a ``width`` x ``height`` image:
    each side rounded to a multiple of ``align`` (std::round: half away from zero); when that area is over
    ``max_pixels``, scaled to it and floored to the grid; under ``min_pixels``, scaled up and ceiled."""
    def rnd(x: float) -> int:
        return int(math.floor(x / align + 0.5)) * align

    w_bar, h_bar = max(align, rnd(width)), max(align, rnd(height))
    if w_bar * h_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(align, math.floor(height / beta / align) * align)
        w_bar = max(align, math.floor(width / beta / align) * align)
    elif w_bar * h_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / align) * align
        w_bar = math.ceil(width * beta / align) * align
    return w_bar, h_bar


def snap_to_grid(im: Image.Image, grid: int, max_pixels: int) -> Image.Image:
    """Each side a multiple of ``grid`` (the pixels of one image token a side: 32 for Qwen3-VL) and the area
    within ``max_pixels``: :func:`smart_resize`, the rule mtmd applies too, but against its own budget (the
    larger of the image's and the crop's), so a crop fitted to 256 tokens' pixels came out 264 tokens
    (756x346 rounded to 768x352). Snapped here, mtmd's resize leaves it as it is. ``grid`` <= 1: unchanged."""
    if grid <= 1:
        return im
    w, h = im.size
    gw, gh = smart_resize(w, h, grid, max_pixels=max_pixels)
    if (gw, gh) == (w, h):
        return im
    resample = Image.Resampling.LANCZOS if gw * gh < w * h else Image.Resampling.BICUBIC
    return im.resize((gw, gh), resample)


def to_png(im: Image.Image) -> bytes:
    """Lossless PNG bytes (what the runtime's append_image takes); compress_level 1: fast, ~2 ms/MP."""
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def model_png(im: Image.Image, *, max_pixels: int = MODEL_MAX_PIXELS,
              min_side: int = MODEL_MIN_SIDE) -> bytes:
    """The image as the model will see it: fitted to the pixel budget, PNG-encoded."""
    return to_png(fit_for_model(im, max_pixels=max_pixels, min_side=min_side))


def jpeg_bytes(im: Image.Image, *, quality: int = 90) -> bytes:
    """JPEG bytes for search backends (smaller uploads than PNG)."""
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
