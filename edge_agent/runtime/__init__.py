"""The llama.cpp runtime: the only package that imports ``llama_cpp``.

``from edge_agent.runtime import Model`` is cheap: llama_cpp (and its shared libraries) is imported the
first time ``Model`` or ``Session`` is touched. The plain values and protocols in ``types`` import
nothing heavy.

    model = Model.load("agent.gguf", "mmproj.gguf", n_threads=2)
    s = model.session()
    s.append_text("<|im_start|>user\\n")
    s.append_image(png_bytes)
    s.append_text("What is this?<|im_end|>\\n<|im_start|>assistant\\n")
    scores = s.score(["I should zoom in.", "I can answer now."])
    g = s.generate(max_tokens=64, stop=["</answer>"])

Layout, bottom up (each module imports only modules above it in this list; no circles):
- ``types``, ``cores``, ``scoring``, ``textstream``, ``state``: pure (no llama_cpp): the plain values
  and protocols, the CPU-core share, candidate tries, stop strings, saved-state files.
- ``_lib``: the binding, process-wide set-up, the abort flag.
- ``buffers``: the llama_batch of numpy buffers a handle decodes.
- ``handle``: one loaded model's llama.cpp pointers and every call on them (decode, KV memory, logits,
  vocabulary, lock, abort, core share, growing the context, token-data buffer).
- ``tokenizer``, ``vision``, ``sampling``, ``batch``, ``forced``: text <-> tokens, images through mtmd,
  choosing the next token, batched scoring, forced text in one verified batch; each through the handle,
  returning values.
- ``session``: one sequence's state (history, positions, pending tokens, logits), applying them.
- ``model``: files, tokenizer, identity; hands out sessions. ``embed``, ``quantize``: tools on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_agent.runtime.types import (
    Checkpoint,
    ContinuationScore,
    Generation,
    ImageChunk,
    ModelLike,
    SessionLike,
    TokenCallback,
)

if TYPE_CHECKING:
    from edge_agent.runtime.model import Model
    from edge_agent.runtime.session import Session

__all__ = [
    "Checkpoint",
    "ContinuationScore",
    "Generation",
    "ImageChunk",
    "Model",
    "ModelLike",
    "Session",
    "SessionLike",
    "TokenCallback",
    "vision_encodes",
]


def __getattr__(name: str) -> Any:
    if name == "Model":
        from edge_agent.runtime.model import Model

        return Model
    if name == "Session":
        from edge_agent.runtime.session import Session

        return Session
    if name == "vision_encodes":  # vision encodes run by this process (all models): one per image
        from edge_agent.runtime.vision import vision_encodes

        return vision_encodes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
