"""How an image enters a model's context, and whether a context holds a question, before anything loads.

Knows: clip's Qwen resize rule ("smart resize", ``tools.images.smart_resize``, which the zoom's crops are
sized by too) and Gemma3's fixed grid, so the image tokens and M-RoPE
positions of an image of a given size (``estimate_image_tokens``), and the check that ``n_ctx`` holds the
prompt, the images and what is reserved, with the setting to change when it does not (``check_context``).
Does not know: how the header is read (``gguf_info.ModelInfo`` is handed in), llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.core.errors import ConfigError
from edge_agent.modelfiles.gguf_info import ModelInfo
from edge_agent.tools.images import smart_resize


@dataclass(frozen=True)
class ImageTokens:
    """How an image of a given size enters the context: nx*ny tokens; M-RoPE advances positions by max(nx,
    ny)."""

    nx: int
    ny: int

    @property
    def n_tokens(self) -> int:
        return self.nx * self.ny

    @property
    def n_pos(self) -> int:
        return max(self.nx, self.ny)


def estimate_image_tokens(
    mmproj: ModelInfo, width: int, height: int, *, min_tokens: int = 0, max_tokens: int = 0
) -> ImageTokens:
    """Image tokens for a ``width`` x ``height`` image, following clip's Qwen resize rule ("smart resize").

    Qwen mergers: the image is scaled (aspect kept) to multiples of patch*merge px (32 for Qwen3-VL) holding
    between 8 and 4096 tokens (mtmd's image_min_tokens / image_max_tokens override those). Gemma3: always
    16x16. Exact for clip in llama.cpp 0.3.36 up to float rounding at exact .5 boundaries.
    """
    if width <= 0 or height <= 0:
        raise ConfigError(f"Image size {width}x{height} is not valid.", title="Image problem")
    if mmproj.projector_type == "gemma3":
        return ImageTokens(16, 16)
    if not mmproj.projector_type.startswith("qwen"):
        raise ConfigError(f"Cannot estimate image tokens for projector '{mmproj.projector_type}'.")
    merge = mmproj.spatial_merge_size or 2
    align = mmproj.patch_size * merge
    area = align * align
    w_bar, h_bar = smart_resize(width, height, align, min_pixels=(min_tokens or 8) * area,
                                max_pixels=(max_tokens or 4096) * area)
    return ImageTokens(w_bar // align, h_bar // align)


def check_context(
    n_ctx: int,
    *,
    prompt_tokens: int = 0,
    image_tokens: int = 0,
    reserve_tokens: int = 0,
    n_ctx_train: int = 0,
) -> int:
    """Raise ConfigError if ``n_ctx`` cannot hold the prompt, the images and ``reserve_tokens`` (answer,
    scored candidates); return the tokens left over. ``image_tokens`` is the sum of
    :func:`estimate_image_tokens` ``.n_tokens`` over the images (KV cells, not positions)."""
    if n_ctx <= 0:
        raise ConfigError(f"n_ctx = {n_ctx}: the context length must be positive. Set n_ctx (e.g. 8192) in "
                          f"the "
                          "settings or with EDGE_AGENT_N_CTX.")
    need = prompt_tokens + image_tokens + reserve_tokens
    if need > n_ctx:
        suggestion = 1 << max(need - 1, 1).bit_length()
        if n_ctx_train and suggestion > n_ctx_train >= need:
            suggestion = n_ctx_train
        limit = f" (the model was trained on up to {n_ctx_train})" if n_ctx_train else ""
        raise ConfigError(
            f"The context of {n_ctx} tokens is too small: the prompt needs {prompt_tokens}, the image(s) "
            f"{image_tokens} and the answer/scoring {reserve_tokens}, {need} in all. Set n_ctx to at least "
            f"{suggestion}{limit} (settings, or EDGE_AGENT_N_CTX={suggestion}), or use a smaller image.",
            title="Context too small")
    return n_ctx - need
