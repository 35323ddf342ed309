"""The runtime and SSR benchmarks run end to end on the tiny Qwen3-VL models (seconds), bench_defer on the
real Qwen 0.5B, and print the ``--json`` keys their reports name: a change to the runtime or the agent's
seams that breaks a benchmark fails here, not when someone next measures. Speed is not asserted
(benchmarks print ratios)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch):
    """The temp dir a benchmark's ``tempfile`` calls use, empty: the test checks that it is left empty (a
    benchmark's homes and question sets had piled up in /tmp, one per run)."""
    d = tmp_path / "tempdir"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def left_in(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_bench_ssr_runs_on_the_tiny_model(capsys):
    """bench_ssr drives the engine with its canned search tools (a ``SearchLike``) through real turns."""
    from scripts import bench_ssr

    assert bench_ssr.main(["--tiny", "--questions", "1", "--turns", "2", "--json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert res["contexts"] == res["context_n_pos"]["n"] >= 1
    assert res["library"]["rationales"] == 6 and res["library"]["unique_tokens"] <= res["library"]["tokens"]
    assert res["ssr_reasoning_s"]["n"] == res["contexts"] and 0 < res["ratio_mean"]


def test_bench_runtime_runs_on_the_tiny_model(capsys, tiny_models):
    """bench_runtime's floor decodes through the model's low-level handle (``Model.handle``); the
    batched pass evaluates only the library trie's inner nodes."""
    from scripts import bench_runtime

    assert bench_runtime.main(["--model", str(tiny_models["text"]), "--reps", "1", "--threads", "1",
                               "--json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert (res["library_size"] == 6
            and res["evaluated_tokens"] < res["unique_scored_tokens"] <= res["library_tokens"])
    assert set(res["median_ms"]) == {"batched", "one_at_a_time", "floor", "floor_inner", "freeform",
                                     "verify16"}
    assert res["ratio_batched_over_one_at_a_time"] > 0 and res["break_even_tokens"] > 0


def test_bench_defer_runs_on_the_real_qwen(capsys, qwen05_gguf, own_tempdir):
    """bench_defer answers a Factbook question through the search service on 127.0.0.1 in both variants and
    switches waiting text back on (the decodes it saves: tests/test_agent_logic.py and test_runtime.py)."""
    from edge_agent.runtime.session import Session
    from scripts import bench_defer

    assert bench_defer.main(["--model", "qwen2.5-coder-0.5b-instruct", "--questions", "1", "--known", "0",
                             "--modes", "freeform", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    s = res["modes"]["freeform"]
    assert s["questions"] == 1 and s["defer_s"] > 0 and s["eager_s"] > 0
    assert s["decodes_defer"] <= s["decodes_eager"]  # fewer when it searches or states its action
    assert Session.defer_appends  # switched back on
    assert left_in(own_tempdir) == []  # its question sets and home are gone


@pytest.mark.parametrize("offline", [False, True])
def test_bench_first_turn_runs_on_the_real_qwen(capsys, qwen05_gguf, offline):
    """bench_first_turn asks a Factbook and a known question as shipped, with turn 1 scored and every check
    read to its end, and in free-form, and finds the same answers and moves both SSR ways; offline (no
    search offered, the answer the only move) without any answer check."""
    from scripts import bench_first_turn

    args = ["--model", "qwen2.5-coder-0.5b-instruct", "--questions", "1", "--json"]
    args += ["--offline"] if offline else []
    assert bench_first_turn.main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["questions"] == 2 and res["same_answers_and_moves"] == 2 and res["offline"] == offline
    assert all(res["model_seconds"][way] > 0 for way in ("shipped", "scored", "freeform"))
    assert res["check_tokens"]["shipped"] <= res["check_tokens"]["scored"]
    if offline:
        assert res["check_tokens"]["scored"] == 0


def test_bench_forced_runs_on_the_tiny_model(capsys, tiny_models):
    """bench_forced measures batch costs and decodes a zoom action three ways, the same tokens each way;
    as shipped it evaluates no more tokens than with drafts after every refusal."""
    from scripts import bench_forced

    assert bench_forced.main([str(tiny_models["text"]), "--reps", "1", "--threads", "1", "--depth", "64",
                              "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["batch_cost"]["1"] == 1.0 and res["batch_cost"]["16"] > 0
    z = res["zoom_action"]
    assert z["same_tokens"] and z["plain"]["evaluated"] == z["plain"]["tokens"] - 1
    assert z["shipped"]["evaluated"] <= z["drafts_after_refusal"]["evaluated"]


def test_bench_state_save_runs_on_the_tiny_model(capsys, tiny_models):
    """bench_state_save copies one context's state three ways, every copy whole."""
    from scripts import bench_state_save

    assert bench_state_save.main([str(tiny_models["text"]), "--cells", "200", "--reps", "2", "--threads", "1",
                                  "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cells"] >= 200 and res["state_mb"] > 0
    assert set(res["seconds"]) == {"numpy", "anonymous_mapping", "prefaulted"}
    assert all(v["median"] > 0 for v in res["seconds"].values()) and res["numpy_over_prefaulted"] > 0


def test_bench_chat_runs_on_smollm2(capsys, smollm2_gguf, own_tempdir):
    """bench_chat on a text model, offline (no search offered): every time to first rationale ends at a
    scoring pass, also where the one rationale left would not be scored in the app, so the read-ahead's
    ratio to the scoring pass is defined (it divided by a scoring of 0 s when the answer's lone rationale
    went unscored)."""
    import math

    from scripts import bench_chat

    assert bench_chat.main(["--smollm2", "--reps", "1", "--typing", "0.2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tokens_at_enter"] == 0 and res["followup_floor_ratio"] == 1.0
    assert math.isfinite(res["enter_ttfr_over_scoring"]) and res["enter_ttfr_over_scoring"] > 0
    assert left_in(own_tempdir) == []
