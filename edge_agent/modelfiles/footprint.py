"""The memory a model choice will take, before it is loaded: for ``models list`` and the settings screen;
and what a photo question measured at the size we ship (``measured_question``: the first-run screen).

Knows: what is resident while the app answers a question (weights, KV cache, vision tower, compute
buffers, the process itself) and how each part follows from a GGUF header or a catalog entry and the
settings. Does not load anything (a header read, ~0.05 s per file) and does not import llama_cpp.

Calibrated on the Qwen3-VL-2B stand-in (``scripts/make_standin_models.py``, the real shapes and
tensor types) with ``scripts/bench_question.py``, which measures the peak resident set of one photo
question with and without a prophet: the estimate is the sum of the parts below; the README's
"What a question costs" table has the measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MB = 2**20
# The process around the model: Python, numpy, PIL, llama.cpp's code, the app's widgets.
PROCESS_BYTES = 160 * MB
# llama.cpp's compute buffers as a question touches them (prefill of n_batch tokens, scoring rows of
# a 151,936-entry vocabulary); per model.
COMPUTE_BYTES = 200 * MB
# The vision tower's activations while it encodes an image, per image token (576 tokens: ~290 MB
# measured on the 2B stand-in's Q8_0 mmproj).
VISION_BYTES_PER_IMAGE_TOKEN = MB // 2

# K and V widths per layer of the catalog's families when no file is on disk yet (published config.json:
# Qwen3-VL-2B 28 layers, 4B 36 layers; both 8 KV heads of 128).
CATALOG_KV_SHAPES = {("qwen3-vl", "2B"): (28, 8, 128, 128), ("qwen3-vl", "4B"): (36, 8, 128, 128),
                     ("qwen2.5-coder", "0.5B"): (24, 2, 64, 64), ("qwen2.5-coder", "1.5B"): (28, 2, 128, 128)}
KV_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}
# kv_type auto: an f16 cache (flash attention off on a CPU: the fastest there, scripts/bench_defaults.py).
# When an f16 cache of n_ctx would take more than AUTO_KV_START_BYTES, the context starts at
# AUTO_KV_START_CELLS (fewer where those bytes hold fewer) and grows to n_ctx as a chat needs it
# (runtime.handle.Handle.grow, ~0.1-0.3 s once per doubling): 2,048 cells hold a photo question with a zoom
# and its answer (the 2B stand-in's: ~1,500 cells) and a text follow-up. Qwen3-VL-2B starts at 224 MiB
# (was 4,096 cells, 448 MiB: the peak of a photo question 2,560 MiB, over the 2,500 target), 4B at 288.
AUTO_KV_START_BYTES = 512 * MB
AUTO_KV_START_CELLS = 2048


@dataclass(frozen=True)
class KvShape:
    n_layer: int
    n_head_kv: int
    head_k: int
    head_v: int

    def resolve(self, n_ctx: int, kv_type: str) -> str:
        """``kv_type`` with auto resolved: f16 (the runtime loads with this rule)."""
        return "f16" if kv_type == "auto" else kv_type

    def start_cells(self, n_ctx: int, kv_type: str) -> int:
        """The cells the context is created with: ``n_ctx``, but with auto, when an f16 cache of ``n_ctx``
        would exceed ``AUTO_KV_START_BYTES``, ``AUTO_KV_START_CELLS`` or the fewer that fit in those bytes
        (in steps of 1,024; it grows to ``n_ctx`` when a chat needs more)."""
        per = self.n_layer * self.n_head_kv * (self.head_k + self.head_v) * 2
        if kv_type != "auto" or n_ctx * per <= AUTO_KV_START_BYTES:
            return n_ctx
        return min(n_ctx, AUTO_KV_START_CELLS, max(1024, AUTO_KV_START_BYTES // per // 1024 * 1024))

    def bytes(self, n_ctx: int, kv_type: str, *, grown: bool = False) -> int:
        """The KV cache a context of ``n_ctx`` cells holds when loaded (``kv_type`` auto resolved as the
        runtime does: its starting size), or once ``grown`` to ``n_ctx``."""
        per = self.n_layer * self.n_head_kv * (self.head_k + self.head_v)
        cells = n_ctx if grown else self.start_cells(n_ctx, kv_type)
        return int(cells * per * KV_ELEMENT_BYTES.get(self.resolve(n_ctx, kv_type), 2.0))


@dataclass(frozen=True)
class Footprint:
    """Expected peak resident bytes of the app answering a photo question, alone and with a prophet."""

    alone: int
    with_prophet: int | None  # None: no prophet of the same shape can be estimated

    def text(self) -> str:
        """'~2.5 GB, 4.4 GB with a prophet'."""
        s = f"~{self.alone / 2**30:.1f} GB"
        return s + (f", {self.with_prophet / 2**30:.1f} GB with a prophet" if self.with_prophet else "")


def prophet_n_ctx(settings: Any) -> int:
    """Context cells of SeProD's prophet (the engine loads it so): the largest image or crop it reads
    plus 1,024 for the query and the draft, in steps of 1,024; never more than ``n_ctx``. Its context
    never holds the chat (``agent.seprod``: one image, then the query, then the draft)."""
    need = settings.vision_max_tokens + 1024
    return min(settings.n_ctx, -(-need // 1024) * 1024)


def kv_shape_of_file(path: str | Path) -> KvShape | None:
    """The KV shape a text GGUF's header gives (None when unreadable)."""
    from edge_agent.core.errors import ModelFileError
    from edge_agent.modelfiles import checks as modelfile

    try:
        return kv_shape_of_info(modelfile.inspect(path))
    except ModelFileError:
        return None


def kv_shape_of_info(info: Any) -> KvShape:
    """The KV shape of a text model's ``modelfile.ModelInfo`` (its header's head counts and widths)."""
    meta, arch = info.metadata, info.architecture
    n_head = int(meta.get(f"{arch}.attention.head_count", 0) or 1)
    head_k = int(meta.get(f"{arch}.attention.key_length", 0) or info.n_embd // max(1, n_head))
    return KvShape(info.n_layer, int(meta.get(f"{arch}.attention.head_count_kv", 0) or n_head), head_k,
                   int(meta.get(f"{arch}.attention.value_length", 0) or head_k))


def kv_shape_of_entry(family: str, params: str) -> KvShape | None:
    shape = CATALOG_KV_SHAPES.get((family, params))
    return KvShape(*shape) if shape else None


def estimate(settings: Any, *, weights: int, mmproj: int, kv: KvShape | None) -> Footprint:
    """The footprint of a model of ``weights`` bytes (+ an ``mmproj`` file of that size, 0: text only)
    at ``settings`` (n_ctx, kv_type, image budgets), alone and with a same-shaped prophet whose context
    holds one image and a draft (``engine.prophet_n_ctx``). The prophet decodes the agent's image
    embeddings (one encode per image) with the agent's vision tower (the same mmproj file: its
    weights are loaded once, ``runtime.tower.VisionTower``): counted once."""
    image_tokens = settings.vision_max_tokens if mmproj else 0
    kv_bytes = kv.bytes(settings.n_ctx, settings.kv_type) if kv else 0
    alone = (PROCESS_BYTES + weights + kv_bytes + COMPUTE_BYTES + mmproj
             + image_tokens * VISION_BYTES_PER_IMAGE_TOKEN)
    if kv is None:
        return Footprint(alone, None)
    prophet = weights + kv.bytes(prophet_n_ctx(settings), settings.kv_type) + COMPUTE_BYTES
    return Footprint(alone, alone + prophet)


# What one photo question cost on the Qwen3-VL 2B / 4B stand-ins (``scripts/bench_question.py --record``
# writes this file; the README's "What a question costs" table is the same run).
QUESTION_COSTS = Path(__file__).parents[1] / "data" / "question_costs.json"


def measured_question(shape: str = "2b") -> dict[str, Any] | None:
    """The recorded costs of one photo question at ``shape`` ({"cores", "ssr_question_s",
    "read_ahead_question_s", "answer_tokens_per_s", "peak_rss_mb", ...}), None when not recorded."""
    import json

    try:
        data = json.loads(QUESTION_COSTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = data.get("shapes", {}).get(shape) if isinstance(data, dict) else None
    return entry if isinstance(entry, dict) else None


def speed_text(shape: str = "2b") -> str:
    """'a photo question about 50 s on 2 cores (12 s with the photo read while you type), answers at
    6.0 tokens/s': the recorded run in words; "" when none is recorded."""
    m = measured_question(shape)
    if not m:
        return ""
    try:
        return (f"a photo question about {m['ssr_question_s']:.0f} s on {m['cores']} cores "
                f"({m['read_ahead_question_s']:.0f} s with the photo read while you type), answers at "
                f"{m['answer_tokens_per_s']:.1f} tokens/s")
    except (KeyError, TypeError, ValueError):
        return ""
