#!/usr/bin/env python3
"""The KV-cache and batch-size defaults at the size we ship, side by side on the 2B stand-in.

Usage:
    python scripts/bench_defaults.py [--standin 2b|4b] [--model GGUF] [--depth 1800] [--reps 3] [--json]
    python scripts/bench_defaults.py --vs-llamacpp --depth 1410 --reps 8 [--json]

- KV cache: llama.cpp's decode time per token (the app's decode threads) after 64 cells and after
  ``--depth`` cells (the context an answer is decoded after in ``bench_question.py``: ~1,800), and the
  prefill time per token of 256 tokens after 0 and after ``--depth`` cells (a crop or a tool result is
  read after ~1,300), for q8_0 + flash attention, f16 + flash attention and f16 without, with the KV
  bytes each takes at n_ctx 8192 and 4096.
- Batch size: a 600-token prefill with n_batch 256 (the app's) and 512.
Variants are measured in rounds, interleaved (the machine is shared and noisy), one model loaded at
a time; medians of ``--reps`` rounds. Random weights change no cost (see make_standin_models.py).

``--vs-llamacpp`` measures only this instead: the app's runtime as the app loads the model (its KV type,
batch, threads and scoring sequences) against llama.cpp at its own defaults in a process of its own
(``scripts/oneshot.py``), in alternating rounds: one-token decodes after ``--depth`` cells and a 256-token
prefill, as ``decode_over_llamacpp_defaults`` and ``prefill_over_llamacpp_defaults`` (the app's time /
llama.cpp's). ``bench_question.py`` reports the same comparison for the answer of a whole photo question.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.benchmodels import filler_tokens  # noqa: E402

KV_VARIANTS = {"q8_0+fa": ("q8_0", "on"), "f16+fa": ("f16", "on"), "f16": ("f16", "off")}
BATCHES = (256, 512)


def decode_ms(model: Any, depth: int, n_tokens: int = 8) -> float:
    """Median ms of one-token decodes after ``depth`` cells (a new context each call)."""
    toks = filler_tokens(model, depth + n_tokens)
    s = model.session()
    s.append_tokens(toks[:depth])
    times = []
    for t in toks[depth:]:
        t0 = time.perf_counter()
        s.append_tokens([t])
        times.append(time.perf_counter() - t0)
    model.session()
    return 1000 * statistics.median(times)


def prefill_ms(model: Any, depth: int, n: int = 256) -> float:
    """ms per token of an ``n``-token prefill after ``depth`` cells (a new context each call)."""
    toks = filler_tokens(model, depth + n)
    s = model.session()
    if depth:
        s.append_tokens(toks[:depth])
    t0 = time.perf_counter()
    s.append_tokens(toks[depth:])
    dt = time.perf_counter() - t0
    model.session()
    return 1000 * dt / n


def prefill_s(model: Any, n: int = 600) -> float:
    toks = filler_tokens(model, n)
    s = model.session()
    t0 = time.perf_counter()
    s.append_tokens(toks)
    dt = time.perf_counter() - t0
    model.session()
    return dt


def vs_llamacpp(path: Path, depth: int, reps: int, n_tokens: int = 8) -> dict[str, Any]:
    """The app's runtime against llama.cpp's defaults in their own process, in alternating rounds."""
    from edge_agent.runtime import Model
    from scripts.oneshot import N_BATCH, OneShot

    app = Model.load(path, None, n_ctx=8192, kv_type="auto")
    toks = filler_tokens(app, depth + n_tokens)
    prefill = filler_tokens(app, 256)
    other = OneShot(path, None, n_ctx=4096, threads=app.n_threads)
    rows: dict[str, list[float]] = {"app_decode": [], "llamacpp_decode": [], "app_prefill": [],
                                    "llamacpp_prefill": []}
    try:
        other.call(cmd="set_depth", tokens=toks[:depth])
        s = app.session()
        s.append_tokens(toks[:depth])
        deep = s.save_state("bench-defaults")
        for r in range(reps):
            for side in (("app", "llamacpp") if r % 2 == 0 else ("llamacpp", "app")):
                if side == "llamacpp":
                    rows["llamacpp_decode"].append(other.call(cmd="decode", tokens=toks[depth:])["decode_ms"])
                    rows["llamacpp_prefill"].append(other.call(cmd="prefill", tokens=prefill)["prefill_s"])
                    continue
                s = app.restore(deep)
                times = []
                for t in toks[depth:]:  # each append evaluates the token before it
                    t0 = time.perf_counter()
                    s.append_tokens([t])
                    times.append(time.perf_counter() - t0)
                rows["app_decode"].append(1000 * statistics.median(times[1:]))
                s = app.session()
                t0 = time.perf_counter()
                s.append_tokens(prefill)
                rows["app_prefill"].append(time.perf_counter() - t0)
            print(f"round {r + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in rows.items()),
                  file=sys.stderr, flush=True)
        kv = f"{app.handle.params.kv_type}, flash attention {app.handle.flash_attn}"
    finally:
        other.close()
        app.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"model": path.name, "depth": depth, "reps": reps, "threads": app.n_threads,
            "app": {"kv": kv, "n_seq_max": app.handle.params.n_seq_max, "n_batch": app.handle.params.n_batch,
                    "decode_ms_at_depth": round(med["app_decode"], 2),
                    "prefill_tokens_per_s": round(256 / med["app_prefill"], 1)},
            "llamacpp_defaults": {"kv": "f16, flash attention off", "n_seq_max": 1, "n_batch": N_BATCH,
                                  "decode_ms_at_depth": round(med["llamacpp_decode"], 2),
                                  "prefill_tokens_per_s": round(256 / med["llamacpp_prefill"], 1)},
            "decode_over_llamacpp_defaults": round(med["app_decode"] / med["llamacpp_decode"], 3),
            "prefill_over_llamacpp_defaults": round(med["app_prefill"] / med["llamacpp_prefill"], 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--standin", default="2b", choices=["2b", "4b"])
    ap.add_argument("--standin-dir", type=Path, default=ROOT / "models" / "standin")
    ap.add_argument("--model", default="", help="your own text GGUF instead of a stand-in")
    ap.add_argument("--depth", type=int, default=1800,
                    help="KV cells before the timed decodes (default 1800)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--vs-llamacpp", action="store_true",
                    help="only the app's runtime against llama.cpp's defaults in their own process")
    args = ap.parse_args(argv)
    from edge_agent.runtime import Model

    if args.model:
        path = Path(args.model)
    else:
        from scripts.make_standin_models import TokenizerMissing, make_standin_models

        try:
            path = make_standin_models(args.standin_dir, args.standin)["text"]
        except TokenizerMissing as e:
            ap.error(str(e))
    if args.vs_llamacpp:
        got = vs_llamacpp(path, args.depth, args.reps)
        if args.json:
            print(json.dumps(got, indent=1))
        else:
            a, b = got["app"], got["llamacpp_defaults"]
            print(f"{got['model']}, {got['threads']} threads, medians of {got['reps']} alternating rounds")
            print(f"decode after {got['depth']} cells: app {a['decode_ms_at_depth']} ms ({a['kv']}), "
                  f"llama.cpp's defaults {b['decode_ms_at_depth']} ms ({b['kv']}): "
                  f"{got['decode_over_llamacpp_defaults']}x")
            print(f"256-token prefill: app {a['prefill_tokens_per_s']} tokens/s, llama.cpp's defaults "
                  f"{b['prefill_tokens_per_s']}: time {got['prefill_over_llamacpp_defaults']}x")
        return 0
    kv: dict[str, list[dict[str, float]]] = {k: [] for k in KV_VARIANTS}
    batch: dict[int, list[float]] = {b: [] for b in BATCHES}
    kv_bytes: dict[str, int] = {}
    threads = 0
    # One model loaded at a time: each model's multi-threaded passes run on a thread of its own
    # (runtime.cores.ComputeLane), and several idle OpenMP teams in one process make every team slower.
    for r in range(args.reps):
        for k in list(KV_VARIANTS)[r % 3:] + list(KV_VARIANTS)[: r % 3]:
            t, fa = KV_VARIANTS[k]
            with Model.load(path, None, n_ctx=8192, n_batch=256, kv_type=t, flash_attn=fa) as m:
                kv_bytes[k], threads = m.memory_bytes["kv_cache"], m.n_threads
                kv[k].append({"64": decode_ms(m, 64), str(args.depth): decode_ms(m, args.depth),
                              "prefill_0": prefill_ms(m, 0), "prefill_depth": prefill_ms(m, args.depth)})
        for b in (BATCHES if r % 2 == 0 else BATCHES[::-1]):
            with Model.load(path, None, n_ctx=8192, n_batch=b, kv_type="auto") as m:
                batch[b].append(prefill_s(m))
        print(f"round {r + 1}/{args.reps}: kv {({k: v[-1] for k, v in kv.items()})}, prefill "
              f"{({b: round(v[-1], 2) for b, v in batch.items()})}", file=sys.stderr, flush=True)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 1)

    d = str(args.depth)
    res = {
        "model": path.name, "decode_threads": threads, "depth": args.depth, "reps": args.reps,
        "kv": {k: {"decode_ms_64": med(v, "64"), f"decode_ms_{d}": med(v, d),
                   "prefill_ms_per_token_0": med(v, "prefill_0"),
                   f"prefill_ms_per_token_{d}": med(v, "prefill_depth"),
                   "kv_mib_at_8192": round(kv_bytes[k] / 2**20),
                   "kv_mib_at_4096": round(kv_bytes[k] / 2**21)}
               for k, v in kv.items()},
        "q8_0_fa_over_f16_at_depth": round(med(kv["q8_0+fa"], d) / med(kv["f16"], d), 3),
        "q8_0_fa_over_f16_prefill_at_depth": round(med(kv["q8_0+fa"],
                                                       "prefill_depth") / med(kv["f16"], "prefill_depth"), 3),
        "prefill_600_s": {str(b): round(statistics.median(v), 2) for b, v in batch.items()},
        "batch_256_over_512": round(statistics.median(batch[256]) / statistics.median(batch[512]), 3),
    }
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{path.name}, decode on {threads} threads; medians of {args.reps}")
        print(f"| KV cache | decode after 64 cells | after {d} | prefill after 0 | after {d} | KV at n_ctx "
              "8192 |\n"
              "|---|---|---|---|---|---|")
        for k, v in res["kv"].items():
            print(f"| {k} | {v['decode_ms_64']} ms | {v[f'decode_ms_{d}']} ms | "
                  f"{v['prefill_ms_per_token_0']} ms/token | "
                  f"{v[f'prefill_ms_per_token_{d}']} ms/token | {v['kv_mib_at_8192']} MiB |")
        print(f"600-token prefill: n_batch 256 {res['prefill_600_s']['256']} s, 512 "
              f"{res['prefill_600_s']['512']} s "
              f"(ratio {res['batch_256_over_512']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
