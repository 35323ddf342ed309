"""`edge-agent eval` end to end on the real runtime: tiny Qwen3-VL models, the synthetic set.

Random weights give random answers, so these tests check structure and invariants, not quality:
every (question, mode) has one result, SSR turns always take the chosen rationale's action type,
timings are real, the outputs are written, the models load once, and a run killed mid-way resumes
to the same results as an uninterrupted one. Searches run ``--offline`` (no network).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent import evaluation as E
from scripts.make_synthetic_vqa import make_dataset
from tests.waits import signal_when

ROOT = Path(__file__).resolve().parents[1]
MAX_TURNS = "2"


def _synthetic(out: Path, n: int) -> Path:
    # Small images keep the tiny model's context short (one image token per 32x32 px).
    return make_dataset(out, n=n, seed=0, size=(320, 240))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")}  # no developer settings
    env.update(EDGE_AGENT_HOME=str(home), EDGE_AGENT_N_THREADS="1", EDGE_AGENT_N_THREADS_BATCH="1",
               EDGE_AGENT_N_CTX="4096", EDGE_AGENT_FREEFORM_MAX_TOKENS="24",
               EDGE_AGENT_ANSWER_MAX_TOKENS="12")
    return env


def _args(data: Path, out: Path, models: dict[str, Path], modes: str) -> list[str]:
    return ["eval", str(data), "--modes", modes, "--out", str(out), "--offline", "--max-turns", MAX_TURNS,
            "--model", str(models["text"]), "--mmproj", str(models["mmproj"]), "--prophet",
            str(models["prophet"]),
            "--prophet-mmproj", str(models["mmproj"])]


def _untimed(rec: dict) -> dict:
    """What must not depend on timing: the answer, the turns and their actions, tools, searches."""
    return {
        "prediction": rec["prediction"], "exact": rec["exact"], "turns": rec["turns"],
        "stop_reason": rec["stop_reason"],
        "tools": rec["tools"], "searches": rec["searches"],
        "turn_log": [(t["action"], t["rationale"]) for t in rec["turn_log"]],
        "accepted": rec["drafts"]["accepted"], "error": rec["error"],
    }


def _quality(metrics: dict) -> dict:
    drop = set(E.TIMING_KEYS)
    return {mode: {k: v for k, v in m.items() if k not in drop} for mode, m in metrics.items()}


@pytest.mark.slow
def test_eval_end_to_end_on_tiny_models(tiny_models, edge_home, tmp_path, monkeypatch):
    """All three modes on the synthetic set: one result each, consistent SSR actions, real timings,
    report + JSON + plot written, models loaded once for the whole run."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli
    from edge_agent.engine.engine import Engine

    data = _synthetic(tmp_path / "svqa", n=2)
    for k, v in _env(edge_home).items():
        if k.startswith("EDGE_AGENT_"):
            monkeypatch.setenv(k, v)
    loads = []
    real = Engine.from_settings.__func__

    def counting(cls, settings, **kw):
        loads.append(settings)
        return real(cls, settings, **kw)

    monkeypatch.setattr(Engine, "from_settings", classmethod(counting))
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, _args(data, out, tiny_models, "freeform,ssr,ssr+seprod"),
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert len(loads) == 1 and loads[0].prophet == str(tiny_models["prophet"])

    rows = [json.loads(x) for x in (out / E.RESULTS_FILE).read_text().splitlines()]
    assert sorted((r["mode"], r["id"]) for r in rows) == sorted(
        (m, q) for m in ("freeform", "ssr", "ssr+seprod") for q in ("svqa-000", "svqa-001"))
    for r in rows:
        assert r["error"] is None, r["error"]
        assert (1 <= r["turns"] <= int(MAX_TURNS) + 1
                and r["stop_reason"] in ("answered", "length", "turn_limit"))
        assert r["model_seconds"] > 0 and all(t["reasoning_seconds"] > 0 for t in r["turn_log"])
        for s in r["searches"]:
            assert s["status"] in ("offline", "unconfigured", "cached", "stale")  # never live: --offline
        if r["mode"] == "freeform":
            assert all(t["rationale"] is None for t in r["turn_log"])
        else:
            assert all(t["rationale"] is not None for t in r["turn_log"])

    metrics = json.loads((out / E.JSON_FILE).read_text())["metrics"]
    assert list(metrics) == ["freeform", "ssr", "ssr+seprod"]
    for mode in ("ssr", "ssr+seprod"):
        # the action is generated under the rationale's grammar
        assert metrics[mode]["action_consistency"] == 1.0
        assert abs(sum(metrics[mode]["rationale_mix"].values()) - 1.0) < 1e-9
    assert metrics["ssr"]["seprod"]["rounds"] == 0 and metrics["freeform"]["scored_turns"] == 0
    for m in metrics.values():
        assert m["reasoning_seconds_per_turn"]["p95"] >= m["reasoning_seconds_per_turn"]["p50"] > 0
        assert m["searches"].get("live", 0) == 0
    report = (out / E.REPORT_FILE).read_text()
    assert "## Mode: ssr+seprod" in report and "## Rationale mix" in report
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in report
    else:
        assert (out / E.PLOT_FILE).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_eval_resumes_after_kill(tiny_models, edge_home, tmp_path):
    """A run killed (SIGKILL) after a few results resumes: the rerun does only the rest, the file
    holds each (question, mode) once, and the results equal an uninterrupted run's."""
    data = _synthetic(tmp_path / "svqa", n=4)
    env = _env(edge_home)
    cmd = [sys.executable, "-m", "edge_agent.commands.cli"]
    modes = "ssr,freeform"
    total = 8

    full = tmp_path / "full"
    done = subprocess.run(cmd + _args(data, full, tiny_models, modes) + ["--no-plot"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    out = tmp_path / "killed"
    results = out / E.RESULTS_FILE
    log = (tmp_path / "killed.log").open("wb")  # a file, not a pipe: nobody drains it while we poll
    proc = subprocess.Popen(cmd + _args(data, out, tiny_models, modes) + ["--no-plot"], env=env, cwd=ROOT,
                            stdout=log, stderr=log)

    def complete_lines() -> int:  # a line still being written when the kill lands is not a result
        return results.read_bytes().count(b"\n") if results.exists() else 0

    try:
        signal_when(proc, lambda: complete_lines() >= 2, signal.SIGKILL, what="two stored results")
    finally:
        log.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    n_before = complete_lines()
    assert 2 <= n_before < total

    again = subprocess.run(cmd + _args(data, out, tiny_models, modes) + ["--no-plot", "--json"], env=env,
                           cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"Resuming: {n_before} of {total}" in again.stderr

    rows = [json.loads(x) for x in results.read_text().splitlines()]
    keys = [(r["mode"], r["id"]) for r in rows]
    assert len(keys) == total and len(set(keys)) == total
    ref = {(r["mode"], r["id"]): r for r in map(json.loads, (full / E.RESULTS_FILE).read_text().splitlines())}
    for r in rows:
        assert _untimed(r) == _untimed(ref[(r["mode"], r["id"])])
    resumed = json.loads(again.stdout)["metrics"]
    uninterrupted = json.loads((full / E.JSON_FILE).read_text())["metrics"]
    assert _quality(resumed) == _quality(uninterrupted)
