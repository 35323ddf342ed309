"""`edge-agent library build|show|check`: make an SSR rationale library from your own traces, see
what it costs on your model, and validate it as the app's loader does.

The logic lives in :mod:`edge_agent.library` (reading traces, generalising, clustering, writing)
and :mod:`edge_agent.agent.rationales` (the loader); this module parses flags, loads the model when
one is needed (embeddings for ``build --model``, token counts and the measured scoring cost for
``show``) and prints.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import click

from edge_agent.agent.rationales import MAX_RATIONALES, Library, library_actions, load_library
from edge_agent.core.config import Settings
from edge_agent.library.build import (
    DEFAULT_MIN_SUPPORT,
    DEFAULT_PER_ACTION,
    DEFAULT_SIMILARITY,
    build_library,
)
from edge_agent.library.generalise import DEFAULT_MAX_CHARS
from edge_agent.library.readers import read_sources
from edge_agent.library.write import write_library
from edge_agent.tools import specs


@click.group("library")
def command() -> None:
    """Build, inspect and check SSR rationale libraries.

    \b
    Examples:
      edge-agent eval svqa/DATA.jsonl --modes freeform --out runs/ff
      edge-agent library build runs/ff -o mine.json            lexical clustering, no model
      edge-agent library build runs/ff chat.json -o mine.json --model smollm2-135m-demo
      edge-agent library show mine.json                         tokens, trie size, scoring cost
      edge-agent library check mine.json
      edge-agent eval svqa/DATA.jsonl --modes ssr --rationales builtin,mine.json
      edge-agent config set rationales mine.json                use it in the app
    """


def _load_model(model: str | None, *, n_seq_max: int = 2, n_ctx: int = 2048):
    """The agent model named by ``model`` (or the settings' model), loaded without its mmproj."""
    from edge_agent.modelfiles.resolution import resolve
    from edge_agent.runtime import Model

    settings = Settings.load({"model": model})
    resolved = resolve(settings)
    m = Model.from_settings(settings, resolved.model_path, None, n_seq_max=n_seq_max, n_ctx=n_ctx)
    return m, resolved.name


@command.command("build")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The library file to write (JSON).")
@click.option("--all", "take_all", is_flag=True,
              help="Use every turn, not only those of questions answered correctly (where the source knows).")
@click.option("--per-action", type=click.IntRange(min=1), default=DEFAULT_PER_ACTION, show_default=True,
              help="Most rationales per action.")
@click.option("--max-total", type=click.IntRange(min=1, max=MAX_RATIONALES), default=MAX_RATIONALES,
              show_default=True, help="Most rationales in all (the runtime scores at most 15).")
@click.option("--max-chars", type=click.IntRange(min=20, max=400), default=DEFAULT_MAX_CHARS,
              show_default=True,
              help="Longest rationale (every scored token costs time on every turn).")
@click.option("--similarity", type=click.FloatRange(min=-1.0, max=1.0), default=DEFAULT_SIMILARITY,
              show_default=True, help="Average cosine similarity at which two clusters merge.")
@click.option("--min-support", type=click.IntRange(min=1), default=DEFAULT_MIN_SUPPORT, show_default=True,
              help="Fewest turns a move must cover to enter the library.")
@click.option("--model", default=None,
              help="Cluster with this model's embeddings (catalog name or GGUF path; mean-pooled hidden "
                   "states). Without it: lexical TF-IDF clustering, no model loaded.")
@click.option("--json", "as_json", is_flag=True, help="Print the build summary as JSON.")
def build(sources: tuple[Path, ...], out: Path, take_all: bool, per_action: int, max_total: int,
          max_chars: int,
          similarity: float, min_support: int, model: str | None, as_json: bool) -> None:
    """Build a library from free-form traces: eval results, exported chats, ask --json logs.

    Free-form turns are grouped by the action they led to; within each action the reasoning
    texts (reduced to their decision sentence, with quoted strings, numbers and names generalised)
    are clustered, and each cluster that recurs gives one rationale: the representative with the
    fewest specifics, then the shortest. Provenance (cluster size, share of turns, example trace
    ids) is kept in each entry's "provenance" field, which the loader ignores.
    """
    read = read_sources(sources)
    embed = None
    method = ""
    closers: list[Any] = []
    try:
        if model is not None:
            from edge_agent.runtime.embed import Embedder

            m, name = _load_model(model)
            closers.append(m)
            emb = Embedder(m)
            closers.insert(0, emb)
            embed = emb.embed
            method = f"{name} embeddings (mean-pooled last hidden layer, centred, cosine)"
        result = build_library(read, take_all=take_all, per_action=per_action, max_total=max_total,
                               max_chars=max_chars, similarity=similarity, min_support=min_support,
                               embed=embed, method=method)
    finally:
        for c in closers:
            c.close()
    path = write_library(result, out, sources=[str(s) for s in sources])
    if as_json:
        click.echo(json.dumps({"out": str(path), "turns": result.used, "traces": read.traces,
                               "skipped_failed": result.skipped_failed,
                               "skipped_garbage": result.skipped_garbage,
                               "clusters": result.clusters, "method": result.method,
                               "dropped": result.dropped,
                               "rationales": result.library_json()["rationales"]}, indent=2))
        return
    click.echo(f"Read {read.traces} traces: {len(read.turns)} free-form turns"
               + (f", {read.scored_turns} SSR turns ignored" if read.scored_turns else "")
               + (f", {read.invalid_turns} malformed" if read.invalid_turns else "") + ".")
    click.echo(f"Used {result.used} turns ({result.skipped_failed} from wrong or failed answers left out"
               + ("" if not take_all else ", --all") + f"; {result.skipped_garbage} with no generic move).")
    click.echo(f"Clustered by {result.method}: "
               + ", ".join(f"{a} {n}" for a, n in result.clusters.items()) + " clusters.")
    click.echo("")
    click.echo(f"{'id':<16} {'turns':>5} {'share':>6}  text")
    for e in result.entries:
        click.echo(f"{e.id:<16} {e.size:>5} {100 * e.share:>5.1f}%  {e.text}")
    if result.dropped:
        click.echo("\nLeft out: " + "; ".join(result.dropped[:8]) + (" ..." if len(result.dropped) > 8
                                                                     else ""))
    answers = [e for e in result.entries if e.action == "answer"]
    if answers and all(e.needs_image for e in answers):
        click.echo("\nNote: every answer rationale mentions the image, so text-only questions fall back to "
                   "them.")
    click.echo(f"\nWrote {path} ({len(result.entries)} rationales). Next: edge-agent library show {path}")


@command.command("check")
@click.argument("file", type=click.Path(path_type=Path))
def check(file: Path) -> None:
    """Validate a library exactly as the app loads it (exit status 2 with the problem if it is bad)."""
    lib = load_library(file)
    counts = {a: sum(1 for r in lib if r.action == a) for a in library_actions()}
    click.echo(f"OK: {file} holds {len(lib)} rationales ("
               + ", ".join(f"{a} {n}" for a, n in counts.items() if n) + ").")
    if not any(r.action == "answer" and not r.needs_image for r in lib):
        click.echo("Note: every answer rationale needs an image; text-only questions fall back to them.")


def _library_arg(file: str) -> Library:
    return load_library(None if file == "builtin" else file)


def scoring_cost(model: Any, texts: list[str], *, reps: int = 3, decode_tokens: int = 16) -> dict[str, float]:
    """Scoring ``texts`` in one batch after a short agent context vs decoding one token, on ``model``.

    The context is the shipped system prompt (every tool) and a question, ending where SSR scores
    (after "<think>\\n"). Medians over ``reps`` interleaved repetitions after a warm-up; the
    break-even length is score time / per-token decode time: how many free-form tokens cost as
    much as scoring the library once.
    """
    from edge_agent.agent.prompts import question_segments, system_prompt

    s = model.session()
    s.append_text(system_prompt([t.action for t in specs.tools()], has_image=True))
    for seg in question_segments("What does the small sign in the top left corner say?", None):
        s.append_text(seg.text, special=seg.special)
    cp = s.checkpoint()
    toks = [model.tokenize(t, special=False) for t in texts]
    score_t: list[float] = []
    decode_t: list[float] = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        s.score(toks)
        dt_score = time.perf_counter() - t0
        s.rollback(cp)
        t0 = time.perf_counter()
        g = s.generate(max_tokens=decode_tokens)
        dt_decode = (time.perf_counter() - t0) / max(1, len(g.tokens))
        s.rollback(cp)
        if r:  # the first round warms up buffers
            score_t.append(dt_score)
            decode_t.append(dt_decode)
    score_s, per_token = statistics.median(score_t), statistics.median(decode_t)
    return {"score_ms": 1000 * score_s, "decode_ms_per_token": 1000 * per_token,
            "break_even_tokens": score_s / per_token}


@command.command("show")
@click.argument("file")
@click.option("--model", default=None,
              help="Count tokens and measure on this model (default: the model in use).")
@click.option("--reps", type=click.IntRange(min=1), default=3, show_default=True, help="Timed repetitions.")
@click.option("--no-measure", is_flag=True, help="Token counts and trie size only (no timing).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(file: str, model: str | None, reps: int, no_measure: bool, as_json: bool) -> None:
    """Entries with token counts, the shared-prefix trie size and the scoring cost on your model.

    FILE is a library JSON file, or `builtin` for the built-in library. The cost is measured:
    scoring every rationale in one batch after a short agent context, in decoded tokens (the
    break-even length: free-form reasoning shorter than that is cheaper than scoring).
    """
    from edge_agent.runtime.scoring import build_trie

    lib = _library_arg(file)
    m, name = _load_model(model, n_seq_max=len(lib) + 1)
    try:
        texts = [r.text for r in lib]
        toks = [m.tokenize(t, special=False) for t in texts]
        trie = build_trie(toks)
        cost = None if no_measure else scoring_cost(m, texts, reps=reps)
    finally:
        m.close()
    provenance = _provenance(file)
    rows = [{"id": r.id, "action": r.action, "needs_image": r.needs_image, "tokens": len(t), "text": r.text,
             **({"turns": provenance[r.id].get("cluster_size"), "share": provenance[r.id].get("share")}
                if r.id in provenance else {})}
            for r, t in zip(lib, toks, strict=True)]
    summary = {"library": lib.source, "model": name, "rationales": len(lib), "tokens": sum(map(len, toks)),
               "trie_nodes": trie.n_tokens, "evaluated_tokens": trie.n_rows, **(cost or {})}
    if as_json:
        click.echo(json.dumps({**summary, "entries": rows}, indent=2))
        return
    click.echo(f"{lib.source}: {len(lib)} rationales, token counts for {name}")
    click.echo("")
    has_prov = any("turns" in r for r in rows)
    click.echo(f"{'id':<18} {'action':<13} {'tokens':>6}" + (f" {'turns':>5} {'share':>6}" if has_prov
                                                             else "") + "  text")
    for r in rows:
        prov = (f" {r.get('turns', ''):>5} " + (f"{100 * r['share']:>5.1f}%" if r.get("share") is not None
                                                else f"{'':>6}")
                if has_prov else "")
        click.echo(f"{r['id']:<18} {r['action']:<13} {r['tokens']:>6}{prov}  {r['text']}")
    click.echo("")
    click.echo(f"tokens: {summary['tokens']} in all; shared-prefix trie: {trie.n_tokens} nodes, "
               f"{trie.n_rows} evaluated in the batch (leaves are scored from their parent's row)")
    if cost is not None:
        click.echo(f"scoring cost on {name}: {cost['score_ms']:.0f} ms per turn = "
                   f"{cost['break_even_tokens']:.1f} decoded tokens ({cost['decode_ms_per_token']:.1f} "
                   f"ms/token; median of {reps})")


def _provenance(file: str) -> dict[str, dict[str, Any]]:
    if file == "builtin":
        return {}
    try:
        data = json.loads(Path(file).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    items = data.get("rationales") if isinstance(data, dict) else data
    return {it["id"]: it["provenance"] for it in items or []
            if isinstance(it, dict) and isinstance(it.get("provenance"), dict) and isinstance(it.get("id"),
                                                                                              str)}
