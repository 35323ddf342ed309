"""Requantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``).

Used by benchmarks to turn a shipped model into the quantization a real deployment uses (e.g.
SmolLM2 Q4_1 -> Q4_K_M, the CPU stand-in for Qwen3-VL's usual Q4_K_M): prefill/decode speed ratios
depend on the type's CPU kernels. Requantizing an already quantized file loses some quality; fine for
speed measurements, not for answers. Knows file types, not models.
"""

from __future__ import annotations

import os
from pathlib import Path

from edge_agent.core.errors import ModelFileError, ModelRuntimeError
from edge_agent.runtime import _lib
from edge_agent.runtime._lib import C
from edge_agent.runtime.cores import default_threads

FILE_TYPES = {
    "F16": C.LLAMA_FTYPE_MOSTLY_F16,
    "Q4_0": C.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q8_0": C.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_M": C.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q5_K_M": C.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q6_K": C.LLAMA_FTYPE_MOSTLY_Q6_K,
}


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], file_type: str, *,
             threads: int = 0) -> Path:
    """Write ``src`` requantized to ``file_type`` (a key of FILE_TYPES) at ``dst``; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    if file_type not in FILE_TYPES:
        raise ModelRuntimeError(f"Unknown file type {file_type!r}. Choose one of {', '.join(FILE_TYPES)}.")
    if not src.is_file():
        raise ModelFileError(f"Model file not found: {src}.")
    _lib.ensure_init()
    params = C.llama_model_quantize_default_params()
    params.nthread = default_threads(threads)
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True
    rc = C.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0 or not dst.is_file():
        raise ModelRuntimeError(f"Quantizing {src.name} to {file_type} failed "
                                f"({_lib.recent_errors() or rc}).")
    return dst
