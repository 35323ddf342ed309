#!/usr/bin/env python3
"""Write a small, deterministic visual-search question set with Pillow.

Every image is large (1600x1200 by default) and cluttered; the answer sits in one small target
(a few dozen pixels: small text on a sign or a tag, a tiny shape in a framed box) that a
vision-language model sees as a handful of blurred pixels once the image is resized to its pixel
budget, so it has to zoom in to read it. That makes the set a smoke test for the whole pipeline
(image -> zoom -> crop -> answer) and a real, if easy, task for real models.

Output (``OUT``): ``images/<id>.png`` and ``DATA.jsonl``, one line per question::

    {"id": "svqa-000", "image": "images/svqa-000.png", "question": "...", "answers": ["..."],
     "kind": "sign_word", "target_bbox_1000": [x1, y1, x2, y2]}

Image paths are relative to DATA.jsonl (the eval's format). ``target_bbox_1000`` is where the
answer is, in the zoom tool's 0-1000 coordinates (for analysis; the eval ignores it).

The same seed and size give the same questions and byte-identical PNGs on the same Pillow
version. Pillow only; no network. Usage::

    python scripts/make_synthetic_vqa.py OUT [--n 12] [--seed 0] [--size 1600x1200]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

# Colour names a model can say, with an RGB that is unambiguous for that name.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 210, 20),
    "orange": (245, 130, 20),
    "purple": (130, 40, 170),
    "pink": (245, 120, 190),
    "brown": (120, 70, 30),
}
SHAPES = ("circle", "square", "triangle", "star", "diamond")
WORDS = (
    "harbor", "lantern", "meadow", "copper", "falcon", "velvet", "canyon", "orchid",
    "pepper", "glacier", "saddle", "thistle", "marble", "walnut", "beacon", "cobalt",
)
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
KINDS = ("sign_word", "tag_number", "box_colour", "box_shape", "code", "dot_count")


@dataclass(frozen=True)
class Item:
    id: str
    image: str
    question: str
    answers: list[str]
    kind: str
    target_bbox_1000: list[int]


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    # Pillow >= 10.1 bundles a scalable default font (needs FreeType); the bitmap fallback is
    # ~11 px, still small enough to need a zoom.
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _shape(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, r: float, fill) -> None:
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif kind == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    elif kind == "star":
        pts = []
        for i in range(10):  # five points, inner radius 0.45 r
            rad = r if i % 2 == 0 else r * 0.45
            a = -math.pi / 2 + i * math.pi / 5
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        draw.polygon(pts, fill=fill)
    else:  # pragma: no cover - KINDS and SHAPES are fixed above
        raise ValueError(kind)


def _clutter(draw: ImageDraw.ImageDraw, rng: random.Random, w: int, h: int, scale: float) -> None:
    """Large, faint distractors: shapes in every colour, lines, and grey filler words (not on signs)."""
    for _ in range(40):
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        x2, y2 = x + rng.uniform(-300, 300) * scale, y + rng.uniform(-300, 300) * scale
        draw.line([x, y, x2, y2], fill=(rng.randint(150, 210),) * 3, width=max(1, int(3 * scale)))
    names = list(COLOURS)
    for _ in range(14):
        colour = COLOURS[rng.choice(names)]
        faded = tuple(int(c * 0.35 + 255 * 0.65) for c in colour)
        _shape(draw, rng.choice(SHAPES), rng.uniform(0, w), rng.uniform(0, h), rng.uniform(40, 140) * scale,
               faded)
    font = _font(max(8, int(13 * scale)))
    for _ in range(12):
        draw.text((rng.uniform(0, w - 80), rng.uniform(0, h - 20)), rng.choice(WORDS), fill=(170, 170, 170),
                  font=font)


def _place(rng: random.Random, w: int, h: int, bw: int, bh: int) -> tuple[int, int]:
    margin = int(0.05 * min(w, h))
    return rng.randint(margin, w - bw - margin), rng.randint(margin, h - bh - margin)


def _bbox_1000(x: int, y: int, bw: int, bh: int, w: int, h: int) -> list[int]:
    return [round(1000 * x / w), round(1000 * y / h), round(1000 * (x + bw) / w), round(1000 * (y + bh) / h)]


def make_item(index: int, rng: random.Random, size: tuple[int, int]) -> tuple[Item, Image.Image]:
    """One question and its image; ``rng`` is consumed in a fixed order, so output depends only on the
    seed."""
    w, h = size
    scale = min(w / 1600, h / 1200)  # keep targets small relative to the image at any size
    bg = tuple(rng.randint(225, 245) for _ in range(3))
    img = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(img)
    _clutter(draw, rng, w, h, scale)
    kind = KINDS[index % len(KINDS)]
    text_px = max(8, int(12 * scale))
    font = _font(text_px)

    if kind == "sign_word":
        word = rng.choice(WORDS)
        bw, bh = int(90 * scale) + 4, int(26 * scale) + 4
        x, y = _place(rng, w, h, bw, bh)
        draw.rectangle([x, y, x + bw, y + bh], fill="white", outline=(60, 60, 60))
        draw.text((x + bw // 2, y + bh // 2), word, fill="black", font=font, anchor="mm")
        question, answers = "What word is written on the small white sign?", [word]
    elif kind == "tag_number":
        number = rng.randint(100, 999)
        bw, bh = int(52 * scale) + 4, int(24 * scale) + 4
        x, y = _place(rng, w, h, bw, bh)
        draw.rounded_rectangle([x, y, x + bw, y + bh], radius=max(2, int(5 * scale)), fill=(250, 225, 40),
                               outline="black")
        draw.text((x + bw // 2, y + bh // 2), str(number), fill="black", font=font, anchor="mm")
        question, answers = "What number is printed on the small yellow tag?", [str(number)]
    elif kind in ("box_colour", "box_shape"):
        colour = rng.choice(list(COLOURS))
        shape = rng.choice(SHAPES)
        bw = bh = int(34 * scale) + 6
        x, y = _place(rng, w, h, bw, bh)
        draw.rectangle([x, y, x + bw, y + bh], fill="white", outline="black", width=max(1, int(2 * scale)))
        _shape(draw, shape, x + bw / 2, y + bh / 2, bw * 0.3, COLOURS[colour])
        if kind == "box_colour":
            question, answers = "What colour is the tiny shape inside the small black-bordered box?", [colour]
        else:
            question, answers = "What shape is drawn inside the small black-bordered box?", [shape]
    elif kind == "code":
        letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
        code = "".join(rng.choice(letters) for _ in range(2)) + str(rng.randint(10, 99))
        label = f"CODE {code}"
        bw, bh = int(80 * scale) + 4, int(18 * scale) + 4
        x, y = _place(rng, w, h, bw, bh)
        draw.rectangle([x, y, x + bw, y + bh], fill=(215, 235, 255))
        draw.text((x + bw // 2, y + bh // 2), label, fill=(10, 10, 60), font=font, anchor="mm")
        question, answers = "What code follows the word CODE on the small pale blue label?", [code]
    else:  # dot_count
        n = rng.randint(2, 7)
        bw = bh = int(40 * scale) + 8
        x, y = _place(rng, w, h, bw, bh)
        draw.rectangle([x, y, x + bw, y + bh], fill="white", outline="black", width=max(1, int(2 * scale)))
        r = max(1.5, 2.5 * scale)
        cells = [(i, j) for i in range(3) for j in range(3)]
        rng.shuffle(cells)
        for i, j in cells[:n]:
            draw.ellipse(
                [x + (i + 0.5) * bw / 3 - r, y + (j + 0.5) * bh / 3 - r, x + (i + 0.5) * bw / 3 + r,
                 y + (j + 0.5) * bh / 3 + r],
                fill=COLOURS["red"],
            )
        question, answers = ("How many red dots are inside the small black-bordered box?",
                             [str(n), NUMBER_WORDS[n]])

    qid = f"svqa-{index:03d}"
    item = Item(
        id=qid,
        image=f"images/{qid}.png",
        question=question,
        answers=answers,
        kind=kind,
        target_bbox_1000=_bbox_1000(x, y, bw, bh, w, h),
    )
    return item, img


def make_dataset(out: Path | str, *, n: int = 12, seed: int = 0,
                 size: tuple[int, int] = (1600, 1200)) -> Path:
    """Write ``n`` questions under ``out``; returns the path of DATA.jsonl. Overwrites earlier files."""
    if n < 1:
        raise ValueError("n must be at least 1")
    if size[0] < 200 or size[1] < 150:
        raise ValueError("size must be at least 200x150")
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        # One generator per item: item i is the same whatever n is.
        rng = random.Random(f"{seed}:{i}")
        item, img = make_item(i, rng, size)
        img.save(out / item.image, format="PNG", optimize=False)
        lines.append(json.dumps(item.__dict__, ensure_ascii=False))
    data = out / "DATA.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 1600x1200, not {text!r}") from None
    return w, h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder (DATA.jsonl + images/)")
    ap.add_argument("--n", type=int, default=12, help="number of questions (default 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=_size, default=(1600, 1200), help="image size WxH (default 1600x1200)")
    args = ap.parse_args(argv)
    try:
        data = make_dataset(args.out, n=args.n, seed=args.seed, size=args.size)
    except ValueError as e:
        ap.error(str(e))
    print(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
