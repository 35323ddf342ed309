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
