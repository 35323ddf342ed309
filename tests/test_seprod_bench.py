"""scripts/bench_seprod.py on the tiny Qwen3-VL pair (one question, one repetition): the ``--json`` keys
others read exist with their exact names, and what they hold is consistent (shares add up, one vision
encode per image with the shared mmproj, a draft prepared during a search is ready and used). Speed
is not asserted (benchmarks print ratios)."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time

from edge_agent.runtime import cores


class CountingShare(cores.CoreShare):
    """The engine's core share, with its own count of the prophet's preemptions and waits (to check
    what the benchmark reports against)."""

    made: list[CountingShare] = []

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.seen_preempts = 0
        self.seen_wait = 0.0
        CountingShare.made.append(self)

    @contextlib.contextmanager
    def background(self, want, *, stop=None, preempt=None):
        def counted():
            self.seen_preempts += 1
            preempt()

        t0 = time.perf_counter()
        with super().background(want, stop=stop, preempt=counted if preempt is not None else None) as step:
            self.seen_wait += time.perf_counter() - t0
            yield step


def test_bench_seprod_json_keys_and_counts(capsys, monkeypatch, tmp_path):
    from scripts import bench_seprod

    tempdir = tmp_path / "tempdir"  # the benchmark's temp files go here, and none stays
    tempdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tempdir))

    CountingShare.made.clear()
    monkeypatch.setattr(cores, "CoreShare", CountingShare)  # the engine takes it from here when it loads
    assert bench_seprod.main(["--pairs", "tiny", "--reps", "1", "--questions", "1", "--answer-tokens", "6",
                              "--sections", "questions,search", "--search-latency", "1.0", "--min-seconds",
                              "0",
                              "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert list(tempdir.iterdir()) == []  # its home per pair was left behind, one per run
    (pair,) = res["pairs"]
    q = pair["questions"]
    assert q["reps"] == 1  # --min-seconds 0: exactly --reps
    assert res["latency_ratio_on_off"] == q["latency_ratio_on_off"] > 0
    assert pair["shared_mmproj"] and q["images"] == 2  # the question's image and the zoomed crop
    assert res[
        "vision_encodes_per_image"] == q["vision_encodes_per_image"] == q["vision_encodes"] / q["images"]
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
    # the agent's batched passes preempt the prophet (runtime.cores), counted per question with SeProD
    # on: the one question and the warm-up. Whether they overlap at all is timing; what is reported must
    # be what the share counted (the first share made is the questions section's engine's).
    share = CountingShare.made[0]
    n_on = 2
    assert q["prophet_preemptions_per_question"] * n_on == share.seen_preempts == share.preemptions
    assert abs(
        q["prophet_paused_seconds_per_question"] * n_on - share.seen_wait) < 0.01 + 1e-4 * share.seen_preempts
    # a search first: the prophet drafts during the agent's call and the network wait; the draft is
    # ready at the answer and used (the tiny pair's random weights accept nothing: used, not accepted)
    srch = pair["search"]
    assert res["search_latency_ratio_on_off"] == srch["latency_ratio_on_off"] > 0
    # 1 s of search: room for the tiny prophet's draft even on a loaded 2-core machine (with 0.2 s the
    # draft was not ready once in a full-suite run at load 10: skipped, share_used 0)
    assert srch["searches"] >= 4 and srch["search_latency_s"] == 1.0  # nothing cached: every ask searched
    assert srch["rounds"] == 1 and srch["share_used"] == 1.0 and srch["share_waited"] == 0.0


def test_bench_seprod_repeats_short_questions_up_to_min_seconds(capsys):
    """--reps is a minimum: a ~0.1-s tiny question is repeated until each variant has ~--min-seconds."""
    from scripts import bench_seprod

    assert bench_seprod.main(["--pairs", "tiny", "--reps", "1", "--questions", "1", "--answer-tokens", "6",
                              "--sections", "questions", "--min-seconds", "0.5", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["pairs"][0]["questions"]
    # as many as fill --min-seconds at the warm-up's pace (on a busy machine a question may take 0.5 s)
    assert q["reps"] == max(1, min(bench_seprod.MAX_REPS, math.ceil(0.5 / max(q["warmup_s"], 1e-3))))
    assert q["rounds"] == 2 * q["reps"]  # every repetition ran (a grounding and an answering round each)
