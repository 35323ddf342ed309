#!/usr/bin/env python3
"""Benchmark forced text under a grammar: what a batch of k tokens costs against a one-token decode, and
a zoom action decoded three ways side by side (as shipped: drafts until one is refused at its first token;
drafts after every refusal; plain token-by-token decoding).

Usage:
    python scripts/bench_forced.py [MODEL.gguf] [--reps 3] [--threads 2] [--depth 1200] [--json]

MODEL defaults to the 2B stand-in (``scripts/make_standin_models.py --size 2b models/standin``). The batch
costs are raw llama.cpp decodes (f16 KV, no flash attention, the app's thread count) after ``--depth``
cells, medians of ``--reps`` interleaved rounds: ``batch_cost[k]`` = seconds of a k-token decode / a
one-token decode. The zoom action follows the same context each time (a padding text, the system prompt,
a question, a zoom rationale and the action's head); the three variants alternate within each round and
must give the same tokens (exit 1 if not). Reported: median seconds, tokens evaluated and decodes of
each, and ``shipped_over_plain`` / ``drafts_after_refusal_over_plain``. Times are wall-clock on a shared
machine: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STANDIN = Path("models/standin/standin-qwen3vl-2b-Q4_K_M.gguf")
BATCHES = (1, 2, 3, 4, 6, 8, 16)
VARIANTS = ("shipped", "drafts_after_refusal", "plain")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("model", type=Path, nargs="?", default=STANDIN)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=1200, help="cells in the context before the batches")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def batch_costs(model: Path, *, threads: int, depth: int, reps: int) -> dict[str, float]:
    """Median seconds of a k-token decode after ``depth`` cells / a one-token decode's, raw llama.cpp."""
    from edge_agent.runtime import _lib

    _lib.ensure_init()  # the runtime's backend and its log callback (one that lives as long as the process)
    C = _lib.C
    m = C.llama_model_load_from_file(str(model).encode(), C.llama_model_default_params())
    if not m:
        raise SystemExit(f"llama.cpp could not load {model}")
    cp = C.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = depth + 64, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = 0
    ctx = C.llama_init_from_model(m, cp)
    mem = C.llama_get_memory(ctx)
    b = C.llama_batch_init(512, 0, 1)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(m))

    def decode(tokens: list[int], p0: int) -> None:
        for j, t in enumerate(tokens):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = t % n_vocab, p0 + j, 1, 1
            b.seq_id[j][0] = 0
        b.n_tokens = len(tokens)
        if C.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    try:
        for p in range(0, depth, 500):
            decode([100 + k % 1000 for k in range(min(500, depth - p))], p)
        times: dict[int, list[float]] = {k: [] for k in BATCHES}
        for _ in range(reps):
            for k in BATCHES:
                t = time.perf_counter()
                decode([200 + j for j in range(k)], depth)
                times[k].append(time.perf_counter() - t)
                C.llama_memory_seq_rm(mem, 0, depth, -1)
        one = statistics.median(times[1])
        return {str(k): round(statistics.median(v) / one, 3) for k, v in times.items()} | {
            "one_token_ms": round(1000 * one, 2)}
    finally:
        C.llama_batch_free(b)
        C.llama_free(ctx)
        C.llama_model_free(m)


def zoom_context() -> str:
    from edge_agent.agent.actions import HEADS
    from edge_agent.agent.prompts import THINK_CLOSE, question_segments, system_prompt

    turn = "".join(getattr(seg, "text", "") for seg in question_segments(
        "What does the small sign on the door say?", None))
    pad = "The photo shows a street with a shop and a small sign on its door. " * 60
    return (pad + system_prompt(("image_search", "text_search", "zoom"), has_image=True) + turn
            + "I should zoom in on the small sign to read it." + THINK_CLOSE + HEADS["zoom"])


def zoom_actions(model: Path, *, threads: int, reps: int) -> dict[str, Any]:
    from edge_agent.agent.actions import TAIL_STOP, tail_grammar
    from edge_agent.runtime import Model

    m = Model.load(model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_seq_max=2)
    text = zoom_context()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        for _ in range(reps):
            for v in VARIANTS:
                s = m.session()
                s.forced_batches = v != "plain"
                s.forced_stop_when_refused = v == "shipped"
                s.append_text(text)
                d0, e0 = s.n_decodes, s.n_evaluated
                t = time.perf_counter()
                g = s.generate(max_tokens=160, grammar=tail_grammar("zoom", n_images=2),
                               stop=[TAIL_STOP["zoom"]])
                runs[v].append({"s": time.perf_counter() - t, "tokens": g.tokens, "text": g.text,
                                "decodes": s.n_decodes - d0, "evaluated": s.n_evaluated - e0})
    finally:
        m.close()
    out: dict[str, Any] = {v: {"median_s": round(statistics.median(r["s"] for r in rs), 3),
                               "tokens": len(rs[0]["tokens"]), "evaluated": rs[0]["evaluated"],
                               "decodes": rs[0]["decodes"]} for v, rs in runs.items()}
    out["text"] = runs["plain"][0]["text"]
    out["same_tokens"] = all(r["tokens"] == runs["plain"][0]["tokens"] for rs in runs.values() for r in rs)
    plain = out["plain"]["median_s"]
    out["shipped_over_plain"] = round(out["shipped"]["median_s"] / plain, 3)
    out["drafts_after_refusal_over_plain"] = round(out["drafts_after_refusal"]["median_s"] / plain, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.model.is_file():
        print(f"No model at {args.model}: make the stand-in with `python scripts/make_standin_models.py "
              "--size 2b models/standin`, or pass a GGUF path.", file=sys.stderr)
        return 2
    res = {"model": args.model.name, "threads": args.threads, "depth": args.depth,
           "batch_cost": batch_costs(args.model, threads=args.threads, depth=args.depth, reps=args.reps),
           "zoom_action": zoom_actions(args.model, threads=args.threads, reps=args.reps)}
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        bc = res["batch_cost"]
        print(f"{args.model.name}, {args.threads} threads, {args.depth} cells deep; one-token decode "
              f"{bc['one_token_ms']} ms")
        print("batch of k tokens / one-token decode: " + ", ".join(f"{k}: {bc[str(k)]}x" for k in BATCHES))
        z = res["zoom_action"]
        for v in VARIANTS:
            print(f"zoom action, {v}: {z[v]['median_s']} s, {z[v]['tokens']} tokens, {z[v]['evaluated']} "
                  f"evaluated in {z[v]['decodes']} decodes")
        print(f"shipped / plain {z['shipped_over_plain']}, drafts after every refusal / plain "
              f"{z['drafts_after_refusal_over_plain']}; same tokens: {z['same_tokens']}")
    return 0 if res["zoom_action"]["same_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
