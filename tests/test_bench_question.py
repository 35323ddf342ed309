"""bench_question runs end to end on the tiny Qwen3-VL models (agent, prophet, one mmproj) and prints
the top-level ``--json`` keys issue 20 names; speed is not asserted (benchmarks print ratios)."""

from __future__ import annotations

import json

KEYS = {"ssr_over_freeform_question", "image_read_share", "peak_rss_mb", "peak_rss_mb_with_prophet",
        "prefill_tokens_per_s", "decode_tokens_per_s", "decode_overhead", "vision_encode_s", "shape"}


def test_bench_question_runs_on_the_tiny_models(capsys, tiny_models):
    from scripts import bench_question

    args = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]),
            "--prophet", str(tiny_models["prophet"]), "--quick", "--answer-tokens", "4", "--freeform-tokens", "4",
            "--json"]
    assert bench_question.main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert KEYS <= set(res)
    assert res["peak_rss_mb_with_prophet"] >= res["peak_rss_mb"] > 0
    ph = res["phases"]
    assert ph["ssr"]["image_tokens"] > 0 and not ph["ssr"]["image_read_ahead"]
    assert ph["ssr_read_ahead"]["image_read_ahead"] and ph["ssr_read_ahead"]["image_read_s"] == 0
    assert ph["freeform"]["reasoning_tokens"] > 0 and ph["ssr"]["scoring_s"] > 0
    assert all(ph[v]["tool"] == "image_zoom_in_tool" and ph[v]["stop_reason"] == "answered" for v in ph)
    assert res["memory"]["seprod_question"]["stop_reason"] == "answered"
    assert res["raw"]["decode_ms"] and res["decode_tokens_per_s"] > 0
    assert res["system_prompt"]["tokens"] > 100  # the system prompt, kept (restored) by later questions
