"""`edge-agent eval DATA.jsonl`: answer quality and latency per mode on one question set.

Runs every question in each chosen mode (freeform, ssr, ssr+seprod) on the same models, loaded
once, and the same search cache; appends each result to ``OUT/results.jsonl`` as it finishes, so an
interrupted run continues where it stopped when the same command is run again. At the end it
writes ``OUT/results.json``, ``OUT/report.md`` and ``OUT/plot.png`` (with the ``plot`` extra).
The logic lives in :mod:`edge_agent.evaluation`; this module only parses flags and shows progress.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from edge_agent import evaluation as E
from edge_agent.commands.progress import EvalProgress
from edge_agent.core.config import Settings
from edge_agent.core.errors import ConfigError, EdgeAgentError

# Settings that change what the agent answers: a results folder is resumed only with the same ones.
FINGERPRINT_SETTINGS = (
    "model", "mmproj", "prophet", "prophet_mmproj", "n_ctx", "max_turns", "ssr_tau", "ssr_sample",
    "ssr_score", "ssr_answer_check", "ssr_answer_check_tokens", "ssr_answer_check_reach",
    "ssr_answer_check_agree",
    "ssr_index_only", "rationales", "freeform_max_tokens", "answer_max_tokens", "temperature",
    "system_prompt", "seed",
    "seprod_draft_len", "seprod_tau", "seprod_a0", "seprod_adaptive", "offline", "text_search",
    "image_search", "search_top_k",
)


def fingerprint(settings: Settings, dataset: Path) -> dict[str, Any]:
    # The set's name, not its path: a moved folder still resumes (records are keyed by question id,
    # and answers are re-scored against the file at the end of every run).
    fp: dict[str, Any] = {"dataset": E.dataset_name(dataset)}
    fp.update({k: getattr(settings, k) for k in FINGERPRINT_SETTINGS})
    return fp


def engine_factory(settings: Settings, *, on_status=None):
    """A function that loads the models once (the runner calls it only if there is work to do).
    ``on_status(text)`` gets the engine's loading steps (shown next to the progress bar)."""

    def make():
        from edge_agent.engine.engine import Engine  # heavy: llama.cpp

        return Engine.from_settings(settings, progress=(lambda msg,
                                                        frac: on_status(msg)) if on_status else None)

    return make


@click.command("eval")
@click.argument("data", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--modes", default=None, metavar="LIST",
              help="Comma-separated modes: freeform, ssr, ssr+seprod, direct (the model alone, no tools), "
                   "and the ablations ssr-index, ssr-k1, ssr-k2. Default: freeform,ssr (and ssr+seprod when "
                   "a prophet is configured).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results folder (default: eval-<DATA name> in the current folder). Rerun with the same "
                   "one to resume.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N questions.")
@click.option("--offline", is_flag=True, default=None, help="Serve searches from the cache only.")
@click.option("--model", default=None, help="Agent model: catalog name or GGUF path.")
@click.option("--mmproj", default=None, help="Vision projector GGUF for the agent model.")
@click.option("--prophet", default=None, help="SeProD prophet (base) model: catalog name or GGUF path.")
@click.option("--prophet-mmproj", default=None, help="mmproj GGUF for the prophet.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None,
              help="Most tool calls per question; then one more turn must answer.")
@click.option("--seed", type=int, default=None,
              help="Random seed (each question adds a number made from its id).")
@click.option("--no-plot", is_flag=True, help="Skip the PNG plot.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON instead of a summary.")
@click.option("--rationales", "libraries", default=None, metavar="LIST",
              help="Compare rationale libraries: comma-separated JSON files, `builtin` for the built-in one. "
                   "Each SSR mode runs once per library, one column each (ssr[builtin], ssr[mine]).")
@click.option("--cluster", default=None, metavar="ray[:ADDRESS]",
              help="Run the questions on a Ray cluster: `ray` (RAY_ADDRESS, else a local cluster sized to "
                   "this machine) or `ray:ADDRESS`. Needs the cluster extra.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="With --cluster: worker processes, each with its own loaded models (default: as many as "
                   "fit).")
@click.option("--threads-per-worker", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --cluster: CPUs Ray reserves for each worker, and llama.cpp's threads there.")
@click.option("--gpus-per-worker", type=click.FloatRange(min=0), default=0.0,
              help="With --cluster: GPUs Ray reserves for each worker (a llama.cpp built with GPU support).")
def command(data: Path, modes: str | None, out_dir: Path | None, limit: int | None, offline: bool | None,
            model: str | None, mmproj: str | None, prophet: str | None, prophet_mmproj: str | None,
            max_turns: int | None, seed: int | None, no_plot: bool, as_json: bool,
            libraries: str | None = None, cluster: str | None = None, workers: int | None = None,
            threads_per_worker: int = 1, gpus_per_worker: float = 0.0) -> None:
    """Evaluate answer quality and latency on a JSONL question set.

    Each line of DATA is {"id", "image", "question", "answers": [...]}, image paths relative to
    DATA. Every question runs in every mode on the same models and cache; results are appended to
    OUT/results.jsonl as they finish, so rerunning the same command resumes an interrupted run.

    \b
    Examples:
      python scripts/make_synthetic_vqa.py svqa
      edge-agent eval svqa/DATA.jsonl --modes freeform,ssr --out runs/svqa
      edge-agent eval svqa/DATA.jsonl --modes ssr,ssr+seprod --prophet base.gguf --limit 5
      edge-agent eval svqa/DATA.jsonl --offline          answer from the search cache only
      edge-agent eval svqa/DATA.jsonl --modes ssr --rationales builtin,mine.json
      edge-agent eval svqa/DATA.jsonl --cluster ray --workers 2   on a Ray cluster (README)
    """
    settings = Settings.load({
        "model": model, "mmproj": mmproj, "prophet": prophet, "prophet_mmproj": prophet_mmproj,
        "offline": offline, "max_turns": max_turns, "seed": seed,
    })
    specs, libs, run_settings = _plan(settings, modes, libraries)
    out_dir = out_dir or Path(f"eval-{E.dataset_name(data)}")

    def counts() -> tuple[int, int]:  # (results saved, results in all)
        return len(E.ResultsStore(out_dir).open().records), len(E.load_dataset(data,
                                                                               limit=limit)) * len(specs)

    from edge_agent.commands import cli, cluster_watch

    # from a shell: watched (Ray may end it)
    if cluster and not cluster_watch.watched() and cli.ARGV is not None:
        sys.exit(cluster_watch.run_watched(cli.ARGV, out_dir / E.RESULTS_FILE, counts))
    outcome = "error"
    try:
        _run(data, specs, libs, settings, run_settings, out_dir, counts, limit=limit, cluster=cluster,
             workers=workers,
             threads_per_worker=threads_per_worker, gpus_per_worker=gpus_per_worker, no_plot=no_plot,
             as_json=as_json)
        outcome = "finished"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        cluster_watch.mark_done(outcome)


def _run(data: Path, specs: list[E.ModeSpec], libs: dict[str, Any], settings: Settings,
         run_settings: Settings,
         out_dir: Path, counts: Any, *, limit: int | None, cluster: str | None, workers: int | None,
         threads_per_worker: int, gpus_per_worker: float, no_plot: bool, as_json: bool) -> None:
    """The eval itself (in the watched child when ``--cluster`` runs from a shell)."""
    fp = fingerprint(settings, data)
    if libs:  # what each column scored: an edited library file is a different configuration
        fp["rationales_compared"] = {name: library_digest(lib) for name, lib in libs.items()}
    ask = E.library_ask(libs) if libs else E.default_ask
    pool = None
    if not cluster and (workers or threads_per_worker != 1 or gpus_per_worker):
        raise click.UsageError("--workers, --threads-per-worker and --gpus-per-worker go with --cluster "
                               "ray[:ADDRESS].")
    if cluster:
        from edge_agent.evaluation.cluster import RayWorkers, parse_cluster

        pool = RayWorkers(run_settings, address=parse_cluster(cluster), workers=workers,
                          threads=threads_per_worker,
                          gpus=gpus_per_worker, ask=ask)
    progress = EvalProgress(out_dir / E.RESULTS_FILE,
                            workers=(lambda: pool.info()["per_worker"]) if pool else None)
    try:
        run = E.run_eval(data, specs, out_dir, engine_factory(run_settings, on_status=progress.status),
                         limit=limit,
                         fingerprint=fp, on_progress=progress, ask=ask, workers=pool,
                         on_question=lambda q, m: progress.working(f"{q.id} {m.name} ..."))
    except KeyboardInterrupt:
        progress.close()
        saved = len(E.ResultsStore(out_dir).open().records)
        click.echo(f"\nInterrupted. {saved} results are saved in {out_dir / E.RESULTS_FILE}; "
                   "run the same command again to continue.", err=True)
        sys.exit(130)
    except EdgeAgentError as e:
        if type(e).__name__ != "ClusterLost":
            raise
        progress.close()
        saved, total = counts()
        raise EdgeAgentError(f"{e.message} {saved} of {total} results are saved in "
                             f"{out_dir / E.RESULTS_FILE} and "
                             "kept. Run the same command again to resume (start the node or the cluster "
                             "again first if you started it yourself).", title=e.title) from None
    progress.close()
    _finish(run, no_plot=no_plot, as_json=as_json)


def _plan(settings: Settings, modes: str | None, libraries: str | None) -> tuple[list[E.ModeSpec], dict[str,
                                                                                                        Any],
        Settings]:
    """The modes to run (one column per compared library), the libraries, and the settings the models load
    with."""
    if modes is None:
        modes = "freeform,ssr" + (",ssr+seprod" if settings.prophet else "")
    libs = compared_libraries(libraries) if libraries else {}
    specs = E.with_libraries(E.parse_modes(modes), list(libs))
    want_seprod = any(m.seprod for m in specs)
    if want_seprod and not settings.prophet:
        raise ConfigError("Mode ssr+seprod needs a prophet model. Pass --prophet GGUF (the agent model's "
                          "base model) or set `prophet` with `edge-agent config`, or leave ssr+seprod out of "
                          "--modes.")
    # Load the prophet only when a mode uses it; SeProD is switched per question, not per load.
    run_settings = settings.updated({"seprod": want_seprod} if want_seprod else {"prophet": "",
                                                                                 "prophet_mmproj": "",
                                                                                 "seprod": False})
    if libs:  # the model is loaded with a scoring sequence per rationale of the largest library
        largest = max(libs.values(), key=len)
        run_settings = run_settings.updated({"rationales": "" if largest.source == "built-in"
                                             else largest.source})
    return specs, libs, run_settings


def _finish(run: E.EvalRun, *, no_plot: bool, as_json: bool) -> None:
    """Write the outputs and print the summary (or the JSON); every question failing alike is an error."""
    paths = E.write_outputs(run, plot=not no_plot)
    failed = all_failed(run.records)
    if as_json:
        click.echo(json.dumps({"out": str(run.out_dir), "metrics": run.metrics,
                               "model_files": run.model_files,
                               "cluster": run.cluster, "files": {k: str(v) if v else None for k,
                                                                 v in paths.items()}},
                              indent=2))
    else:
        click.echo(_summary(run))
        click.echo(f"\nReport: {paths['report']}\nResults: {paths['json']}")
        if paths["plot"]:
            click.echo(f"Plot: {paths['plot']}")
        elif not no_plot:
            click.echo(f"Plot skipped: {plot_skipped_reason(failed)}")
    if failed:
        raise EdgeAgentError(f"Every question failed with the same error: {failed} Fix that and run the same "
                             f"command again (the results folder {run.out_dir} resumes).",
                             title="Evaluation failed")


def all_failed(records: list[dict[str, Any]]) -> str | None:
    """The one error every record failed with (None: some question ran, or the errors differ)."""
    errors = {r.get("error") for r in records}
    if not records or None in errors or len(errors) != 1:
        return None
    return str(next(iter(errors))).rstrip(".") + "."


def plot_skipped_reason(failed: str | None) -> str:
    """Why there is no plot.png although one was asked for."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return ("matplotlib is not installed: install the plot extra (pip install 'edge-agent[plot]') for "
                "plot.png.")
    if failed:
        return "no question got an answer, so there are no timed turns to plot."
    return "no timed turns to plot yet."


def compared_libraries(text: str) -> dict[str, Any]:
    """``"builtin,mine.json"`` -> {column name: loaded library}, in order; each is validated as the app
    loads it. Names: ``builtin``, else the file's stem (``mine``; a repeated stem gets a number)."""
    from edge_agent.agent.rationales import load_library

    out: dict[str, Any] = {}
    for raw in text.split(","):
        raw = raw.strip()
        if not raw:
            continue
        builtin = raw.lower() in ("builtin", "built-in")
        lib = load_library(None if builtin else raw)
        name = base = "builtin" if builtin else Path(raw).stem
        k = 2
        while name in out:
            name, k = f"{base}{k}", k + 1
        out[name] = lib
    if not out:
        raise ConfigError("--rationales names no library. Pass files and/or `builtin`, e.g. --rationales "
                          "builtin,mine.json.")
    return out


def library_digest(lib: Any) -> str:
    """A short hash of what a library makes the agent score (ids, actions, texts, image flags)."""
    import hashlib

    rows = [[r.id, r.action, r.text, r.needs_image] + ([True] if r.needs_evidence else [])
            + (["before_evidence"] if r.before_evidence else []) for r in lib]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _summary(run: E.EvalRun) -> str:
    rows = [f"{'mode':<12} {'exact':>7} {'contains':>9} {'turns':>6} {'reason/turn':>12} {'p95':>9} "
            f"{'model/q':>9}"]
    for name, m in run.metrics.items():
        r = m["reasoning_seconds_per_turn"]

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        def ms(x):
            return "n/a" if x is None else f"{1000 * x:.0f} ms"

        mean_q = m["model_seconds_per_question"]["mean"]
        turns = m["turns_per_question"]["mean"]
        rows.append(f"{name:<12} {pct(m['success']['exact']):>7} {pct(m['success']['contains']):>9} "
                    f"{'n/a' if turns is None else f'{turns:.2f}':>6} {ms(r['mean']):>12} {ms(r['p95']):>9} "
                    f"{'n/a' if mean_q is None else f'{mean_q:.2f} s':>9}")
    return "\n".join(rows)
