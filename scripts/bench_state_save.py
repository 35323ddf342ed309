#!/usr/bin/env python3
"""Benchmark saving a context's state after an answer: the KV bytes copied out into a fresh numpy array
(before), a plain anonymous mapping, and a pre-faulted one (``runtime.buffers.prefaulted_bytes``, as
shipped), side by side.

Usage:
    python scripts/bench_state_save.py [MODEL.gguf] [--cells 1800] [--reps 7] [--json]

MODEL defaults to the 2B stand-in (``scripts/make_standin_models.py --size 2b models/standin``). A session
holds ``--cells`` cells of text (a photo question with a zoom fills ~1,500-1,900); each round copies its
state once per variant in alternating order, with other allocations and a decode between copies (as
between answers). Reported: each variant's seconds (allocation + llama_state_seq_get_data), median and
range, ``numpy_over_prefaulted`` and the state's size. Wall-clock on a shared machine: read the ratios.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STANDIN = Path("models/standin/standin-qwen3vl-2b-Q4_K_M.gguf")
TEXT = "The photo shows a street with a shop, a door and a small sign above it. "


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("model", type=Path, nargs="?", default=STANDIN)
    ap.add_argument("--cells", type=int, default=1800, help="cells in the context whose state is saved")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def variants() -> dict[str, Callable[[int], np.ndarray]]:
    from edge_agent.runtime.buffers import prefaulted_bytes

    return {"numpy": lambda n: np.empty(n, dtype=np.uint8),
            "anonymous_mapping": lambda n: np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8),
            "prefaulted": prefaulted_bytes}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.model.exists():
        print(f"No model at {args.model}: make the stand-in with `python scripts/make_standin_models.py "
              "--size 2b models/standin`, or pass a GGUF.", file=sys.stderr)
        return 2
    from edge_agent.runtime import Model
    from edge_agent.runtime._lib import C

    u8p = ctypes.POINTER(ctypes.c_uint8)
    with Model.load(args.model, n_ctx=args.cells + 256, n_threads=args.threads, n_threads_batch=args.threads,
                    n_seq_max=1) as m:
        s = m.session()
        while s.n_cells < args.cells:
            s.append_text(TEXT * max(1, min(40, (args.cells - s.n_cells) // 16)))
        h = m.handle
        make = variants()
        times: dict[str, list[float]] = {k: [] for k in make}
        size = 0
        for r in range(args.reps):
            order = list(make) if r % 2 == 0 else list(make)[::-1]
            for name in order:
                size = int(C.llama_state_seq_get_size(h._ctx, 0))
                t = time.perf_counter()
                kv = make[name](size)
                got = int(C.llama_state_seq_get_data(h._ctx, kv.ctypes.data_as(u8p), size, 0))
                times[name].append(time.perf_counter() - t)
                if got != size:
                    print(f"llama.cpp copied {got} of {size} bytes", file=sys.stderr)
                    return 1
                del kv
                junk = [np.ones(2_000_000) for _ in range(4)]  # other allocations between answers
                del junk
                s.append_text(" And more.")
                s.next_logits()
        cells = s.n_cells
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "model": str(args.model), "cells": cells, "state_mb": round(size / 1e6, 1), "reps": args.reps,
        # to the microsecond: a small model's copy can take under 50 us, which 4 decimals reported as 0
        "seconds": {k: {"median": round(med[k], 6), "min": round(min(v), 6), "max": round(max(v), 6),
                        "each": [round(x, 6) for x in v]} for k, v in times.items()},
        "numpy_over_prefaulted": round(med["numpy"] / med["prefaulted"], 2) if med["prefaulted"] else None,
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"state of {cells} cells, {out['state_mb']} MB, {args.reps} interleaved rounds")
        for k, v in out["seconds"].items():
            print(f"  {k:18s} median {v['median']:.3f} s  ({v['min']:.3f}-{v['max']:.3f})")
        print(f"  numpy / prefaulted: {out['numpy_over_prefaulted']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
