#!/usr/bin/env python3
"""What one question about a photo costs at the size we ship: phase by phase, SSR vs free-form.

Usage:
    python scripts/bench_question.py [--standin 2b|4b] [--model GGUF --mmproj GGUF [--prophet GGUF]]
                                     [--reps 2] [--quick] [--no-prophet] [--json] [--out FILE] [--record]
                                     [--set NAME=VALUE ...]

Models: ``--standin 2b`` (default) writes or reuses the Qwen3-VL-2B-shaped random-weight stand-ins of
``scripts/make_standin_models.py`` under ``models/standin/`` (agent, prophet, one shared mmproj);
``--model/--mmproj/--prophet``: your own files. Everything runs through the real ``Engine`` at the
default settings (threads, context, KV type, batch: what the app uses on this machine), offline, with
a temporary ``EDGE_AGENT_HOME``; ``--set NAME=VALUE`` changes one for a what-if (``settings`` in the
JSON names them; the one-shot baseline is llama.cpp's and keeps its defaults).

The question: one 768x768 photo (576 image tokens), a policy that zooms in turn 1 and answers in
turn 2, answers of a fixed 32 tokens (``--answer-tokens``), free-form reasoning of up to 128 tokens a
turn (``--freeform-tokens``, as ``bench_ssr.py``). Random weights write gibberish, so the number of
tokens each step generates is fixed by those limits (an action ends when its grammar closes it).
Variants, interleaved per repetition (the order rotates), each a new chat, the vision embedding cache
cleared first:
- ``ssr``: the photo read with the question (vision encode + its tokens decoded);
- ``freeform``: the same, reasoning written by the model;
- ``ssr_read_ahead``: the photo and the typed question read ahead (``Engine.read_ahead``, as the app
  does on attach and while typing; untimed), then the SSR question;
- ``oneshot``: what a person could use instead, llama.cpp alone answering the same photo question in
  one shot (``scripts/oneshot.py``, a process of its own: the image through mtmd's helper, the
  question, a 32-token answer; no agent, no tools) at llama.cpp's own defaults (f16 KV cache, flash
  attention off, batch 512; every core). ``--no-oneshot`` skips it.
The first question of the run evaluates the system prompt (no saved state yet): ``system_prompt``
compares its context opening with the later ones, which restore the saved state.

Phases per variant (medians over repetitions, seconds; tokens counted): vision encode, image tokens
decoded, context opening (system prompt restored + the question's tokens), SSR scoring per turn,
free-form reasoning, the zoom action's decode, the zoom (crop, its encode and decode), the answer decode
(ms per answer token from the stream's timestamps), the question's wall time.

Raw llama.cpp speed on the loaded agent (through the runtime's thinnest path: one llama_decode per
token plus the copy of its logits row, no sampling): prefill tokens/s by batch threads, decode
ms/token by decode threads after 64 tokens and after as many KV cells as the app's answer is decoded
after (attention reads every cell); ``decode_overhead`` = the app's seconds per answer token / the
best raw decode at that context length (``decode_overhead_vs_short_context``: against 64 tokens).

Memory: peak resident set (VmHWM) of the app's work with the agent alone (its load and the
questions; the high-water mark is reset before each question, so the benchmark's own raw-decode
rounds do not count), then of loading the agent and the prophet and a question (SeProD on: the same
question runs end to end), and each model's KV bytes.

Top-level JSON keys (contract of issue 20): ``ssr_over_freeform_question``, ``image_read_share`` (share
of an SSR question spent reading the photo: encode + decode), ``peak_rss_mb``,
``peak_rss_mb_with_prophet``, ``prefill_tokens_per_s``, ``decode_tokens_per_s``, ``decode_overhead``,
``vision_encode_s``, ``shape``; also ``logits_finite`` (every raw generate's log-probs and every SSR
scoring finite). Issue 28: ``oneshot_s``, ``ssr_over_oneshot`` and ``read_ahead_over_oneshot`` (question
wall seconds / one-shot seconds), ``answer_decode_over_llamacpp_defaults`` (the app's answer ms/token /
llama.cpp's defaults after as many cells) and ``prefill_over_llamacpp_defaults`` (llama.cpp's defaults'
prefill tokens/s / the app runtime's, the same 256 tokens, sampled in the same rounds) and
``crop_floor_over_oneshot`` ((one-shot + the SSR question's crop encode and decode) / one-shot: the least a
question with a zoom can cost at this crop size, were everything else the agent adds free). The machine is
shared and noisy: read ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from PIL import Image, ImageDraw  # noqa: E402

from edge_agent.engine.face import AskRequest  # noqa: E402
from scripts.benchmodels import filler_tokens, proc_status_mb  # noqa: E402
from scripts.oneshot import OneShot  # noqa: E402
from scripts.question_report import VARIANTS, record, summarise, table  # noqa: E402,F401  (record: the API)

QUESTION = "What does the small sign on the door say?"
PREFILL_TOKENS = 256
ONESHOT_N_CTX = 4096  # llama-mtmd-cli's default context


# ----------------------------------------------------------------------------------------------
# set-up
# ----------------------------------------------------------------------------------------------
def make_photo(path: Path, size: int = 768) -> Path:
    """A deterministic 768x768 'photo' (a facade with a door, windows and a small sign), JPEG."""
    img = Image.new("RGB", (size, size), (142, 168, 196))
    d = ImageDraw.Draw(img)
    d.rectangle((60, 180, 700, 760), fill=(176, 122, 92))
    for x in range(100, 660, 140):
        for y in range(230, 520, 120):
            d.rectangle((x, y, x + 80, y + 80), fill=(60, 80, 110), outline=(230, 230, 230), width=4)
    d.rectangle((320, 560, 440, 760), fill=(80, 50, 30))
    d.rectangle((338, 590, 422, 620), fill=(240, 240, 220))
    d.text((344, 598), "OPEN 9-5", fill=(10, 10, 10))
    for i in range(0, size, 7):  # texture, so the JPEG is photo-sized rather than flat
        d.line((0, i, size, (i * 13) % size), fill=(120 + i % 60, 110, 100), width=1)
    img.save(path, format="JPEG", quality=90)
    return path


# settings each variant sets itself (load_engine, ask_once): a --set of them would be overridden unseen
_BENCH_SETS = frozenset({"model", "mmproj", "prophet", "prophet_mmproj", "seprod", "offline",
                         "answer_max_tokens", "freeform_max_tokens", "mode"})


def setting_values(assignments: list[str], ap: argparse.ArgumentParser) -> dict[str, str]:
    """``--set NAME=VALUE`` pairs, each checked as a config file's would be (a clear error, not a crash
    minutes into the run)."""
    from edge_agent.core.config import ConfigError, Settings

    out: dict[str, str] = {}
    for a in assignments:
        name, eq, value = a.partition("=")
        if not eq or not name.strip():
            ap.error(f"--set takes NAME=VALUE, e.g. --set crop_max_tokens=96; got {a!r}")
        out[name.strip()] = value.strip()
    own = sorted(set(out) & _BENCH_SETS)
    if own:
        ap.error(f"--set {own[0]}: the benchmark sets it itself (use --model/--mmproj/--prophet, "
                 "--answer-tokens, --no-prophet)")
    with tempfile.TemporaryDirectory(prefix="bench-question-set-") as home:
        try:
            Settings.load(out, env={"EDGE_AGENT_HOME": home})
        except ConfigError as e:
            ap.error(f"--set: {e}")
    return out


def resolve_files(args: argparse.Namespace,
                  ap: argparse.ArgumentParser) -> tuple[str, dict[str, Path | None]]:
    """(shape label, {"text", "mmproj", "prophet"}) from --standin or --model/--mmproj/--prophet."""
    if args.model:
        if not args.mmproj:
            ap.error("--model needs --mmproj (the question is about a photo)")
        files: dict[str, Path | None] = {"text": Path(args.model), "mmproj": Path(args.mmproj),
                                         "prophet": Path(args.prophet) if args.prophet else None}
        return Path(args.model).stem, files
    from scripts.make_standin_models import TokenizerMissing, make_standin_models

    try:
        paths = make_standin_models(args.standin_dir, args.standin)
    except TokenizerMissing as e:
        ap.error(str(e))
    return args.standin, {"text": paths["text"], "mmproj": paths["mmproj"], "prophet": paths["prophet"]}


def load_engine(home: Path, files: dict[str, Path | None], *, prophet: bool, answer_tokens: int,
                extra: dict[str, str] | None = None) -> Any:
    """An Engine at the default settings (offline, temp home), optionally with the prophet; ``extra``:
    settings of ``--set`` (what-ifs, e.g. a smaller crop), applied as a config file's would be."""
    from edge_agent.core.config import Settings
    from edge_agent.engine.engine import Engine

    overrides: dict[str, Any] = {**(extra or {}), "model": str(files["text"]), "mmproj": str(files["mmproj"]),
                                 "offline": True, "answer_max_tokens": answer_tokens}
    if prophet and files.get("prophet") is not None:
        overrides.update(prophet=str(files["prophet"]), prophet_mmproj=str(files["mmproj"]), seprod=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")}
    env["EDGE_AGENT_HOME"] = str(home)
    return Engine.from_settings(Settings.load(overrides, env=env))


def peak_rss_mb() -> float:
    """This process' peak resident set size so far (VmHWM; ru_maxrss where /proc is absent)."""
    peak_mb = proc_status_mb("VmHWM")
    if peak_mb is not None:
        return peak_mb
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class AppPeak:
    """The peak resident memory of the app's own work (loading, questions), without the benchmark's
    (the raw-decode rounds' saved context): the kernel's high-water mark is reset before each span
    of app work (``/proc/self/clear_refs`` 5, Linux >= 4.0) and read after it. Where it cannot be
    reset, the whole process' peak is reported (it can only be higher)."""

    def __init__(self) -> None:
        self.mb = 0.0

    def start(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def stop(self) -> float:
        self.mb = max(self.mb, peak_rss_mb())
        return self.mb


# ----------------------------------------------------------------------------------------------
# raw llama.cpp speed
# ----------------------------------------------------------------------------------------------
def raw_prefill(model: Any, cores: int) -> dict[str, Any]:
    """Prefill tokens/s of ``PREFILL_TOKENS`` tokens by batch threads (1 and all cores), through
    ``append_tokens`` (llama_decode in n_batch pieces, one logits row copied)."""
    from edge_agent.runtime.cores import FOREGROUND

    toks = filler_tokens(model, PREFILL_TOKENS)
    h = model.handle  # the runtime's llama.cpp handle: its batch thread count is not a public setting
    threads0, batch0 = h.n_threads, h.n_threads_batch
    out: dict[str, float] = {}
    try:
        for n in sorted({1, cores}):
            h.n_threads_batch = n
            model.share_cores(None, FOREGROUND, n_threads=threads0)  # applies (decode, batch) threads
            s = model.session()
            t0 = time.perf_counter()
            s.append_tokens(toks)
            out[str(n)] = round(len(toks) / (time.perf_counter() - t0), 2)
    finally:
        h.n_threads_batch = batch0
        model.share_cores(None, FOREGROUND, n_threads=threads0)
        model.session()  # leave an empty context behind
    return out


class RawDecode:
    """Samples of llama.cpp's decode time per token at each thread count, and of ``generate`` (the
    app's sampling path: greedy, the answer grammar, log-probs) at the app's thread count, taken in
    small rounds between the questions so that both see the same load on a shared machine.

    Two context lengths: 64 tokens, and the KV cells the app's answer is decoded after (``depth``,
    from the first question: system prompt, photo, question, zoom and crop): attention reads every
    cell, so a token costs more after 1,800 cells than after 64 (2B stand-in, q8_0 KV: ~110 vs ~78
    ms). ``decode_overhead`` compares the app's answer tokens with the raw decode at that length."""

    def __init__(self, model: Any, cores: int, contexts: Any = None,
                 baseline: Baseline | None = None) -> None:
        self.model, self.counts, self.contexts, self.baseline = model, sorted({1, cores}), contexts, baseline
        self.samples: dict[str, list[float]] = {str(n): [] for n in self.counts}
        self.deep: dict[str, list[float]] = {str(n): [] for n in self.counts}
        self.generate: list[float] = []
        self.generate_deep: list[float] = []
        self.finite = True
        self.depth = 0
        # the deep context, saved once and restored each round; kept on disk between rounds, so that
        # its ~100 MB of KV bytes do not count in the questions' peak resident memory
        self._state_file: Path | None = None

    def set_depth(self, cells: int, state_file: Path) -> None:
        """Measure from now on also after ``cells`` cells of context (prefilled once, then restored)."""
        import pickle

        m = self.model
        try:
            s = m.session()
            s.append_tokens(filler_tokens(m, cells))
            state_file.write_bytes(pickle.dumps(s.save_state("bench-raw")))
            self._state_file, self.depth = state_file, cells
            if self.baseline is not None:
                self.baseline.set_depth(cells)
        finally:
            self._forget()

    def round(self, n_tokens: int = 4) -> None:
        """One round: ``n_tokens`` single-token decodes per thread count (interleaved), then
        ``generate`` of ``n_tokens`` tokens, after a 64-token context and after ``depth`` cells."""
        m = self.model
        toks = filler_tokens(m, 64 + n_tokens)
        try:
            s = m.session()
            s.append_tokens(toks[:64])
            self._sample(s, toks[64:], self.samples, self.generate, n_tokens)
            if self._state_file is not None:
                import pickle

                state = pickle.loads(self._state_file.read_bytes())  # written by set_depth above
                self._sample(m.restore(state), toks[64:], self.deep, self.generate_deep, n_tokens)
                del state
            if self.baseline is not None:
                self.baseline.round(n_tokens)
        finally:
            self._forget()

    def _sample(self, s: Any, toks: list[int], into: dict[str, list[float]], gen_into: list[float],
                n_tokens: int) -> None:
        from edge_agent.agent.actions import TAIL_STOP, tail_grammar
        from edge_agent.runtime.cores import FOREGROUND

        m, threads0 = self.model, self.model.n_threads
        try:
            for i in range(n_tokens):
                for n in self.counts:
                    m.share_cores(None, FOREGROUND, n_threads=n)
                    t0 = time.perf_counter()
                    s.append_tokens([toks[i]])
                    into[str(n)].append(time.perf_counter() - t0)
        finally:
            m.share_cores(None, FOREGROUND, n_threads=threads0)
        s.next_logits()
        gen = s.generate(max_tokens=n_tokens + 1, grammar=tail_grammar("answer"), stop=[TAIL_STOP["answer"]])
        self.finite = self.finite and all(math.isfinite(x) for x in gen.logprobs)  # NaN/inf logits show here
        if len(gen.tokens) > 1:  # the first token is sampled from logits already there
            gen_into.append(gen.seconds / (len(gen.tokens) - 1))

    def _forget(self) -> None:
        self.model.session()
        # The engine's chat contexts held the session just replaced: forget it, so the next
        # question opens as after a restart (the system prompt restored from its saved state).
        if self.contexts is not None:
            self.contexts.live = None

    def result(self) -> dict[str, Any]:
        def ms(samples: dict[str, list[float]]) -> dict[str, float]:
            return {n: round(1000 * statistics.median(v), 2) for n, v in samples.items() if v}

        shallow, deep = ms(self.samples), ms(self.deep)
        best = min(shallow.items(), key=lambda kv: kv[1])
        best_deep = min(deep.items(), key=lambda kv: kv[1]) if deep else None
        gen = round(1000 * statistics.median(self.generate), 2) if self.generate else None
        app = str(self.model.n_threads)
        return {"decode_ms": shallow, "best_decode_threads": int(best[0]), "best_decode_ms": best[1],
                "depth_cells": self.depth, "decode_ms_at_depth": deep,
                "best_decode_ms_at_depth": best_deep[1] if best_deep else None,
                "generate_ms": gen,
                "generate_ms_at_depth": round(1000 * statistics.median(self.generate_deep), 2)
                if self.generate_deep else None,
                "app_threads": {"decode": self.model.n_threads, "batch": self.model.n_threads_batch},
                "sampling_overhead": round(gen / shallow[app], 3) if gen and app in shallow else None,
                "samples": {n: len(v) for n, v in self.samples.items()}, "logprobs_finite": self.finite}


class Baseline:
    """llama.cpp alone at its own defaults (``scripts/oneshot.py``, in a process of its own) beside the app:
    the one-shot question, and in each round of raw samples a prefill of the same ``PREFILL_TOKENS`` filler
    tokens by it and by the app's runtime (the app's KV type, batch and threads), and its decode after as
    many cells as the app's answer is decoded after (the app's side of that: ``RawDecode``)."""

    def __init__(self, worker: Any, model: Any) -> None:
        self.w, self.model = worker, model  # the app's model: its tokenizer gives the worker the same ids
        self.prefill: list[float] = []
        self.app_prefill: list[float] = []
        self.deep: list[float] = []
        self.depth = 0

    def set_depth(self, cells: int) -> None:
        self.w.call(cmd="set_depth", tokens=filler_tokens(self.model, cells))
        self.depth = cells

    def round(self, n_tokens: int) -> None:
        toks = filler_tokens(self.model, PREFILL_TOKENS)
        self.prefill.append(self.w.call(cmd="prefill", tokens=toks)["prefill_s"])
        s = self.model.session()  # the caller forgets it afterwards
        t0 = time.perf_counter()
        s.append_tokens(toks)
        self.app_prefill.append(time.perf_counter() - t0)
        if self.depth:
            deep = filler_tokens(self.model, self.depth + n_tokens)[self.depth :]
            self.deep.append(self.w.call(cmd="decode", tokens=deep)["decode_ms"])

    def ask(self, answer_tokens: int, photo: Path) -> dict[str, Any]:
        """The one-shot question, in the phases' terms."""
        r = self.w.call(cmd="ask", image=str(photo), question=QUESTION, answer_tokens=answer_tokens)
        return {"question_s": r["oneshot_s"], "image_read_s": r["image_s"], "oneshot_image_s": r["image_s"],
                "question_open_s": r["text_s"], "answer_s": r["answer_s"],
                "answer_tokens": r["answer_tokens"],
                "tokens_evaluated": r["prompt_tokens"] + r["answer_tokens"],
                "logits_finite": r["logits_finite"],
                "answer_ms_per_token": 1000 * r["answer_s"] / max(1, r["answer_tokens"])}

    def result(self) -> dict[str, Any]:
        med = statistics.median
        return {"threads": self.w.ready.get("threads"), "kv": "f16, flash attention off", "n_batch": 512,
                "prefill_tokens_per_s": round(PREFILL_TOKENS / med(self.prefill), 2) if self.prefill
                else None,
                "app_prefill_tokens_per_s": round(PREFILL_TOKENS / med(self.app_prefill), 2)
                if self.app_prefill else None,
                "depth_cells": self.depth, "decode_ms_at_depth": round(med(self.deep), 2) if self.deep
                else None,
                "samples": len(self.prefill)}


# ----------------------------------------------------------------------------------------------
# one question, phase by phase
# ----------------------------------------------------------------------------------------------
def ask_once(engine: Any, photo: Path, variant: str, *, answer_tokens: int, freeform_tokens: int,
             seprod: bool = False) -> dict[str, Any]:
    """Run one question (a new chat) and return its phases from the agent's events."""
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.runtime import vision

    def policy(turn: int, allowed: frozenset[str]) -> set[str]:
        return {"zoom"} if turn == 1 and "zoom" in allowed else {"answer"}

    mode = "freeform" if variant == "freeform" else "ssr"
    # every answer answer_tokens long, as the one-shot's (the stand-in's random weights loop: stopped there,
    # SSR's answer was 20 tokens against 32 in the run of 2026-12-06)
    opts = AgentOptions.from_settings(engine.settings, mode=mode, policy=policy, stop_loops=False,
                                      answer_max_tokens=answer_tokens,
                                      freeform_max_tokens=freeform_tokens, library=engine.library)
    vision.clear_cache()
    if variant == "ssr_read_ahead":  # as the app does while the question is typed: not timed
        if hasattr(engine, "read_ahead"):  # the photo and the typed words into the pending user turn
            engine.read_ahead(QUESTION, photo)
            engine.read_ahead_idle(timeout=1800)
        else:  # older engines: the photo's vision encode only
            engine.prepare_image(photo)
    t0 = time.perf_counter()
    stamped = [(time.perf_counter() - t0, e) for e in _events(engine.ask(AskRequest(QUESTION, photo,
                                                                                    options=opts,
                                                                                    seprod=seprod)))]
    wall = time.perf_counter() - t0
    return phases(stamped, wall)


def _events(stream: Iterator[Any]) -> Iterator[Any]:
    yield from stream


def phases(stamped: list[tuple[float, Any]], wall: float) -> dict[str, Any]:
    """Seconds and tokens per phase of one question from its (timestamp, event) list."""
    from edge_agent.agent import events as ev

    p: dict[str, Any] = {"question_s": wall, "scoring_s": 0.0, "reasoning_s": 0.0, "reasoning_tokens": 0}
    answer_times = []
    for t, e in stamped:
        if isinstance(e, ev.ContextOpened):
            # tokens evaluated after Enter (what was read ahead counts in tokens_evaluated too)
            p.update(open_s=e.seconds, open_tokens=e.tokens_evaluated - e.tokens_read_ahead,
                     open_read_ahead=e.tokens_read_ahead, system_restored=e.system_restored,
                     open_reused=e.tokens_reused)
        elif isinstance(e, ev.ImageEvaluated):
            key = "image" if e.turn == 0 else "crop"
            p.update({f"{key}_encode_s": e.encode_seconds, f"{key}_decode_s": e.decode_seconds,
                      f"{key}_tokens": e.tokens, f"{key}_reused": e.reused})
        elif isinstance(e, ev.RationaleScored):
            p["scoring_s"] += e.seconds
            p["scores_finite"] = p.get("scores_finite", True) and all(math.isfinite(c.score)
                                                                      for c in e.candidates)
        elif isinstance(e, ev.ReasoningDone):
            p["reasoning_s"] += e.seconds
            p["reasoning_tokens"] += e.n_tokens
        elif isinstance(e, ev.ToolCalled):
            p.update(zoom_action_s=e.action_seconds, tool=e.name)
        elif isinstance(e, ev.ToolFinished):
            p.update(zoom_tool_s=e.seconds, tool_ok=e.ok)
        elif isinstance(e, ev.TurnFinished):
            if e.action == "answer":
                p["answer_s"] = e.action_seconds
            else:
                p["zoom_observe_s"] = e.observe_seconds
        elif isinstance(e, ev.AnswerToken):
            answer_times.append(t)
        elif isinstance(e, ev.AgentError):
            p.setdefault("errors", []).append(f"{e.title}: {e.message}"[:200])
        elif isinstance(e, ev.FinalAnswer):
            tot = e.totals
            p.update(stop_reason=e.stop_reason, turns=e.turns,
                     tokens_evaluated=tot.get("tokens_evaluated", 0),
                     generated_tokens=tot.get("generated_tokens", 0),
                     answer_tokens=tot.get("answer_tokens", 0),
                     seprod={k: v for k, v in tot.items() if k.startswith(("draft", "seprod", "prophet"))})
    if len(answer_times) > 2:  # steady state: the first streamed token carries the answer's set-up
        p["answer_ms_per_token"] = 1000 * (answer_times[-1] - answer_times[1]) / (len(answer_times) - 2)
    # The photo read ahead: its ImageEvaluated reports the reading done before the question (untimed);
    # the question's context opening did not evaluate it (fewer tokens than the image has).
    ahead = p.get("open_tokens", 0) < p.get("image_tokens", 0)
    p["image_read_ahead"] = ahead
    p["image_read_s"] = 0.0 if ahead else p.get("image_encode_s", 0.0) + p.get("image_decode_s", 0.0)
    p["question_open_s"] = p.get("open_s", 0.0) - p["image_read_s"]
    p["question_tokens"] = p.get("open_tokens", 0) - (0 if ahead else p.get("image_tokens", 0))
    return p


def run_questions(engine: Any, photo: Path, reps: int, raw: RawDecode, *, answer_tokens: int,
                  freeform_tokens: int, say: Callable[[str], None], peak: AppPeak) -> dict[str, Any]:
    """A first (cold) question, then ``reps`` rounds of every variant in rotating order (the one-shot
    baseline among them when ``raw`` has one); a round of raw decode samples after each question (its
    memory not in ``peak``)."""
    kw = {"answer_tokens": answer_tokens, "freeform_tokens": freeform_tokens}
    variants = tuple(v for v in VARIANTS if v != "oneshot" or raw.baseline is not None)

    def ask(variant: str) -> dict[str, Any]:
        if variant == "oneshot":
            assert raw.baseline is not None
            return raw.baseline.ask(answer_tokens, photo)
        peak.start()
        try:
            return ask_once(engine, photo, variant, **kw)
        finally:
            peak.stop()

    cold = ask("ssr")
    live = engine.contexts.live
    if live is not None:  # the cells the answer was decoded after (the middle of the answer)
        raw.set_depth(max(64, live.n_cells - answer_tokens // 2), photo.with_name("raw-depth.state"))
    raw.round()
    say(f"  first question (system prompt evaluated): {cold['question_s']:.1f} s")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(reps):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            runs[v].append(ask(v))
            raw.round()
            say(f"  rep {r + 1}/{reps} {v:15s} {runs[v][-1]['question_s']:6.1f} s")
    return {"cold": cold, "runs": runs, "medians": {v: medians(rs) for v, rs in runs.items()}}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric field, the median over repetitions (booleans and strings: the first run's)."""
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        vals = [r[k] for r in runs if k in r]
        if isinstance(v, bool) or not isinstance(v, int | float):
            out[k] = v
        else:
            out[k] = round(statistics.median(vals), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--standin", default="2b", choices=["2b", "4b"], help="stand-in size (default 2b)")
    ap.add_argument("--standin-dir", type=Path, default=ROOT / "models" / "standin",
                    help="where stand-ins are cached")
    ap.add_argument("--model", default="", help="your own agent GGUF (instead of a stand-in)")
    ap.add_argument("--mmproj", default="", help="its mmproj")
    ap.add_argument("--prophet", default="",
                    help="a prophet GGUF (same tokenizer) for the memory/SeProD part")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each variant (default 2)")
    ap.add_argument("--quick", action="store_true", help="one repetition, fewer decode samples")
    ap.add_argument("--no-prophet", action="store_true", help="skip loading the prophet")
    ap.add_argument("--no-oneshot", action="store_true", help="skip the one-shot baseline (llama.cpp alone)")
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--freeform-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting other than its default, e.g. --set crop_max_tokens=96 (a what-if; "
                         "not with --record)")
    ap.add_argument("--record", action="store_true",
                    help="write this run's costs into edge_agent/data/question_costs.json (what the app's "
                         "first-run screen quotes; stand-ins only)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps = 1
    if args.record and args.model:
        ap.error("--record is for the stand-ins (--standin 2b|4b), whose shapes the app's catalog ships")
    extra = setting_values(args.settings, ap)
    if args.record and extra:
        ap.error("--record writes what the app's defaults cost: leave out --set")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    shape, files = resolve_files(args, ap)
    from edge_agent.runtime.cores import physical_cores

    cores = physical_cores()
    with tempfile.TemporaryDirectory(prefix="bench-question-") as tmp:
        photo = make_photo(Path(tmp) / "photo.jpg")
        say(f"loading {files['text']} (+ mmproj)")
        peak = AppPeak()
        peak.start()  # loading the agent, then each question (not the raw rounds between them)
        engine = load_engine(Path(tmp) / "home", files, prophet=False, answer_tokens=args.answer_tokens,
                             extra=extra)
        peak.stop()
        worker = None
        try:
            if not args.no_oneshot:
                say("starting the one-shot baseline (llama.cpp alone, its own process)")
                worker = OneShot(files["text"], files["mmproj"],  # type: ignore[arg-type]
                                 n_ctx=ONESHOT_N_CTX, threads=cores)
            say("raw llama.cpp speed")
            prefill = raw_prefill(engine.model, cores)
            base = Baseline(worker, engine.model) if worker is not None else None
            decode = RawDecode(engine.model, cores, engine.contexts, base)
            decode.round()
            say(f"  prefill tokens/s by batch threads {prefill}")
            q = run_questions(engine, photo, args.reps, decode, answer_tokens=args.answer_tokens,
                              freeform_tokens=args.freeform_tokens, say=say, peak=peak)
            raw = {"prefill_tokens": PREFILL_TOKENS, "prefill_tokens_per_s": prefill, **decode.result(),
                   "llamacpp_defaults": base.result() if base is not None else None}
            say(f"  decode {raw}")
            mem: dict[str, Any] = {"peak_rss_mb": peak.mb, "process_peak_rss_mb": peak_rss_mb(),
                                   "agent": engine.memory()["agent"]}
        finally:
            if worker is not None:
                worker.close()
            engine.close()
        if files.get("prophet") is not None and not args.no_prophet:
            say("loading the agent and the prophet (SeProD on)")
            both = AppPeak()
            both.start()  # the agent-only engine is closed: loading both models, then the question
            engine = load_engine(Path(tmp) / "home", files, prophet=True, answer_tokens=args.answer_tokens,
                                 extra=extra)
            try:
                sp = ask_once(engine, photo, "ssr", answer_tokens=args.answer_tokens,
                              freeform_tokens=args.freeform_tokens, seprod=True)
                mem.update(peak_rss_mb_with_prophet=both.stop(), with_prophet=engine.memory(),
                           seprod_question=sp)
                say(f"  SeProD question: {sp['question_s']:.1f} s, peak RSS "
                    f"{mem['peak_rss_mb_with_prophet']:.0f} MB")
            finally:
                engine.close()
    res = summarise(shape, raw, q, mem)
    res["cores"] = cores
    res["settings"] = extra  # --set: what differs from the defaults ({} for the app as shipped)
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    if args.record:
        record(res, " ".join(["scripts/bench_question.py", *(argv if argv is not None else sys.argv[1:])]))
    text = json.dumps(res, indent=1, default=str)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        print(text)
    else:
        print(table(res))
        print({k: res[k] for k in ("shape", "ssr_over_freeform_question", "image_read_share", "peak_rss_mb",
                                   "peak_rss_mb_with_prophet", "prefill_tokens_per_s", "decode_tokens_per_s",
                                   "decode_overhead", "vision_encode_s")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
