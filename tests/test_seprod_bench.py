"""scripts/bench_seprod.py on the tiny Qwen3-VL pair (one question, one repetition): the ``--json`` keys
others read exist with their exact names, and what they hold is consistent (shares add up, one vision
encode per image with the shared mmproj, a draft prepared during a search is ready and used). Speed
is not asserted (benchmarks print ratios)."""

from __future__ import annotations

import json


def test_bench_seprod_json_keys_and_counts(capsys):
    from scripts import bench_seprod

    assert bench_seprod.main(["--pairs", "tiny", "--reps", "1", "--questions", "1", "--answer-tokens", "6",
                              "--sections", "questions,search", "--search-latency", "0.2", "--min-seconds", "0",
                              "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    (pair,) = res["pairs"]
    q = pair["questions"]
    assert q["reps"] == 1  # --min-seconds 0: exactly --reps
    assert res["latency_ratio_on_off"] == q["latency_ratio_on_off"] > 0
    assert pair["shared_mmproj"] and q["images"] == 2  # the question's image and the zoomed crop
    assert res["vision_encodes_per_image"] == q["vision_encodes_per_image"] == q["vision_encodes"] / q["images"]
    # one encode per image: the agent's embedding reaches the prophet (for the question's image, read
    # by both models at the same moment, the second waits for the first one's encode)
    assert q["vision_encodes"] == q["images"]
    assert q["rounds"] == 2  # a grounding and an answering round in the one SeProD-on question
    assert abs(q["share_used"] + q["share_skipped"] - 1.0) < 1e-9
    assert abs(q["share_skipped_not_ready"] + q["share_skipped_low_acceptance"] - q["share_skipped"]) < 1e-9
    assert 0.0 <= q["share_waited"] <= q["share_used"]
    row = q["rows"][0]
    assert row["off_answer_tokens"] <= 6 and row["on_answer_tokens"] <= 6
    assert pair["threads"]["prophet"][0] >= 1
    # the agent's batched passes preempt the prophet (runtime.cores), counted per question
    assert q["prophet_preemptions_per_question"] >= 0 and q["prophet_paused_seconds_per_question"] >= 0
    # a search first: the prophet drafts during the agent's call and the network wait; the draft is
    # ready at the answer and used (the tiny pair's random weights accept nothing: used, not accepted)
    srch = pair["search"]
    assert res["search_latency_ratio_on_off"] == srch["latency_ratio_on_off"] > 0
    assert srch["searches"] >= 4 and srch["search_latency_s"] == 0.2  # nothing cached: every ask searched
    assert srch["rounds"] == 1 and srch["share_used"] == 1.0 and srch["share_waited"] == 0.0


def test_bench_seprod_repeats_short_questions_up_to_min_seconds(capsys):
    """--reps is a minimum: a ~0.1-s tiny question is repeated until each variant has ~--min-seconds."""
    from scripts import bench_seprod

    assert bench_seprod.main(["--pairs", "tiny", "--reps", "1", "--questions", "1", "--answer-tokens", "6",
                              "--sections", "questions", "--min-seconds", "0.5", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["pairs"][0]["questions"]
    assert 1 < q["reps"] <= bench_seprod.MAX_REPS
    assert q["rounds"] == 2 * q["reps"]  # every repetition ran (a grounding and an answering round each)
